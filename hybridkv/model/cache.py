"""Paged cache state for V4Mini: per-layer pools, one request's state, and its checkpoints.

Interface the runtime adapts to (contract):
  * ``PagedCache(cfg, num_blocks, device, fill)`` holds, per layer, an SWA pool
    ``[num_blocks, cfg.swa_block, head_dim]``; per compressed (CSA/HCA) layer a compressed pool
    ``[num_blocks, cfg.comp_block, head_dim]``; per CSA layer an indexer-key pool
    ``[num_blocks, cfg.comp_block, idx_dim]``.  fp32, dense, so every pool passes the kernels'
    ABI check.  New pools are filled with ``fill`` (NaN by default: reading a row nobody wrote
    poisons the output instead of passing silently).
  * ``SeqState`` is one request: ``length`` tokens done, and per layer a ``LayerState`` with
    block tables (logical -> physical; SWA block b holds positions [b*swa_block, (b+1)*swa_block),
    compressed/indexer block b holds entries [b*comp_block, ...); -1 = not held) and the open
    compressor windows ``tail`` / ``idx_tail`` (``Tail(start, kv, gate)``: raw fp32 projection
    rows for positions [start, length), i.e. length mod m rows plus the overlap rows).
  * ``state.checkpoint()`` exports the state at H = ``state.length`` as a ``Checkpoint`` of plain
    tensors: per layer the SWA rows [max(0, H-W), H), compressed entries [0, H//m), indexer keys
    [0, H//4), and both tails -- exactly the five objects' contents "at H" (minus disk).
  * ``SeqState.restore(cache, ckpt)`` validates the checkpoint (``CheckpointIncomplete`` names
    the first missing/mis-sized object, nothing allocated) and writes it into fresh blocks of
    ``cache`` (any physical ids).  Continuing from it gives bit-identical logits to continuing
    the state the checkpoint came from, with the same chunking.
"""
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch


class PoolExhausted(Exception):
    """No free block in the pool ``(kind, layer)``."""

    def __init__(self, kind, layer):
        self.kind, self.layer = kind, layer
        super().__init__(f"pool {kind} of layer {layer} has no free block")


class CheckpointIncomplete(Exception):
    """A checkpoint object does not match its H: ``what`` names it, ``value`` is (got, want)."""

    def __init__(self, what, value):
        self.what, self.value = what, value
        super().__init__(f"checkpoint object {what} incomplete: got {value[0]}, want {value[1]}")


class Tail(NamedTuple):
    start: int
    kv: torch.Tensor
    gate: torch.Tensor


class LayerCheckpoint(NamedTuple):
    swa_start: int
    swa_rows: torch.Tensor
    comp: Optional[torch.Tensor]
    idx: Optional[torch.Tensor]
    tail: Optional[Tail]
    idx_tail: Optional[Tail]


class Checkpoint(NamedTuple):
    H: int
    layers: tuple


def tail_start(H, ratio, overlap):
    """First raw row the open window at H still needs."""
    return max(0, (H // ratio) * ratio - overlap)


class PagedCache:
    """Per-layer pools and free lists (see module docstring)."""

    def __init__(self, cfg, num_blocks=64, device="cpu", fill=float("nan")):
        self.cfg, self.num_blocks, self.device = cfg, num_blocks, torch.device(device)
        hd = cfg.head_dim
        self.pools = {}
        for layer, kind in enumerate(cfg.layers):
            self.pools[("swa", layer)] = (cfg.swa_block, hd)
            if kind != "swa":
                self.pools[("comp", layer)] = (cfg.comp_block, hd)
            if kind == "csa":
                self.pools[("idx", layer)] = (cfg.comp_block, cfg.idx_dim)
        self.pools = {k: torch.full((num_blocks, *s), fill, device=self.device)
                      for k, s in self.pools.items()}
        self.free_blocks = {k: list(range(num_blocks - 1, -1, -1)) for k in self.pools}

    def pool(self, kind, layer):
        return self.pools[(kind, layer)]

    def alloc(self, kind, layer):
        free = self.free_blocks[(kind, layer)]
        if not free:
            raise PoolExhausted(kind, layer)
        return free.pop()

    def release(self, kind, layer, block):
        self.free_blocks[(kind, layer)].append(block)


@dataclass
class LayerState:
    kind: str
    swa: list = field(default_factory=list)
    comp: list = field(default_factory=list)
    idx: list = field(default_factory=list)
    tail: Optional[Tail] = None
    idx_tail: Optional[Tail] = None


class SeqState:
    """One request's cache state in a PagedCache (see module docstring)."""

    def __init__(self, cache):
        self.cache, self.cfg, self.length = cache, cache.cfg, 0
        self.layers = [LayerState(k) for k in self.cfg.layers]
        width = {"csa": 2 * self.cfg.head_dim, "hca": self.cfg.head_dim}
        for ls in self.layers:
            if ls.kind != "swa":
                ls.tail = _empty_tail(width[ls.kind], cache.device)
            if ls.kind == "csa":
                ls.idx_tail = _empty_tail(2 * self.cfg.idx_dim, cache.device)

    # -- block tables ------------------------------------------------------------------
    def reserve(self, n_new):
        """Allocate the blocks positions [length, length + n_new) will write (all or none)."""
        cfg, end, got = self.cfg, self.length + n_new, []
        try:
            for layer, ls in enumerate(self.layers):
                _grow(self.cache, "swa", layer, ls.swa, -(-end // cfg.swa_block), got)
                if ls.kind != "swa":
                    n_ent = end // cfg.ratio(ls.kind)
                    _grow(self.cache, "comp", layer, ls.comp, -(-n_ent // cfg.comp_block), got)
                if ls.kind == "csa":
                    _grow(self.cache, "idx", layer, ls.idx,
                          -(-(end // cfg.csa_ratio) // cfg.comp_block), got)
        except PoolExhausted:
            for table, kind, layer, b in reversed(got):
                table.pop()
                self.cache.release(kind, layer, b)
            raise

    def slide(self):
        """Release SWA blocks that lie wholly before the window of the next query."""
        cfg = self.cfg
        for layer, ls in enumerate(self.layers):
            for b in range(len(ls.swa)):
                if ls.swa[b] >= 0 and (b + 1) * cfg.swa_block <= self.length - cfg.window:
                    self.cache.release("swa", layer, ls.swa[b])
                    ls.swa[b] = -1

    def free(self):
        for layer, ls in enumerate(self.layers):
            for kind in ("swa", "comp", "idx"):
                for b in getattr(ls, kind):
                    if b >= 0:
                        self.cache.release(kind, layer, b)
                setattr(ls, kind, [])

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint(self):
        """Export every object at H = length as plain tensors (copies)."""
        cfg, H = self.cfg, self.length
        out = []
        for layer, ls in enumerate(self.layers):
            s0 = max(0, H - cfg.window)
            swa = _read(self.cache.pool("swa", layer), ls.swa, range(s0, H))
            comp = idx = None
            if ls.kind != "swa":
                comp = _read(self.cache.pool("comp", layer), ls.comp,
                             range(H // cfg.ratio(ls.kind)))
            if ls.kind == "csa":
                idx = _read(self.cache.pool("idx", layer), ls.idx, range(H // cfg.csa_ratio))
            out.append(LayerCheckpoint(s0, swa, comp, idx, _copy(ls.tail), _copy(ls.idx_tail)))
        return Checkpoint(H, tuple(out))

    @classmethod
    def restore(cls, cache, ckpt):
        """A new SeqState in ``cache`` holding exactly ``ckpt``; validates before allocating."""
        validate(cache.cfg, ckpt)
        st, H = cls(cache), ckpt.H
        st.length = H
        st.reserve(0)
        st.slide()
        for layer, (ls, lc) in enumerate(zip(st.layers, ckpt.layers)):
            _write(cache.pool("swa", layer), ls.swa, range(lc.swa_start, H), lc.swa_rows)
            if lc.comp is not None:
                _write(cache.pool("comp", layer), ls.comp, range(len(lc.comp)), lc.comp)
            if lc.idx is not None:
                _write(cache.pool("idx", layer), ls.idx, range(len(lc.idx)), lc.idx)
            ls.tail, ls.idx_tail = _copy(lc.tail), _copy(lc.idx_tail)
        return st


def validate(cfg, ckpt):
    """Every object of every layer is present and sized for exactly H (else raise)."""
    H = ckpt.H
    if len(ckpt.layers) != len(cfg.layers):
        raise CheckpointIncomplete("layers", (len(ckpt.layers), len(cfg.layers)))
    for layer, (kind, lc) in enumerate(zip(cfg.layers, ckpt.layers)):
        want = [("swa", lc.swa_rows, H - max(0, H - cfg.window))]
        if kind != "swa":
            r = cfg.ratio(kind)
            ov = r if kind == "csa" else 0
            want += [("comp", lc.comp, H // r), ("tail", lc.tail, H - tail_start(H, r, ov))]
        if kind == "csa":
            r = cfg.csa_ratio
            want += [("idx", lc.idx, H // r), ("idx_tail", lc.idx_tail, H - tail_start(H, r, r))]
        for name, obj, n in want:
            got = None if obj is None else (obj.kv if isinstance(obj, Tail) else obj).shape[0]
            if got != n or (isinstance(obj, Tail) and obj.start + n != H):
                raise CheckpointIncomplete(f"layer{layer}.{name}", (got, n))


def _empty_tail(width, device):
    z = torch.zeros((0, width), device=device)
    return Tail(0, z, z.clone())


def _copy(t):
    return None if t is None else Tail(t.start, t.kv.clone(), t.gate.clone())


def _grow(cache, kind, layer, table, n_blocks, got):
    while len(table) < n_blocks:
        b = cache.alloc(kind, layer)
        table.append(b)
        got.append((table, kind, layer, b))


def _read(pool, table, rows):
    rows = torch.as_tensor(list(rows), dtype=torch.long)
    bs = pool.shape[1]
    blocks = torch.as_tensor(table, dtype=torch.long)[rows // bs] if len(rows) else rows
    if (blocks < 0).any():
        raise IndexError(f"checkpoint read of an unheld block at rows {rows[blocks < 0].tolist()}")
    return pool[blocks, rows % bs].clone()


def _write(pool, table, rows, values):
    rows = torch.as_tensor(list(rows), dtype=torch.long)
    if len(rows):
        bs = pool.shape[1]
        pool[torch.as_tensor(table, dtype=torch.long)[rows // bs], rows % bs] = values
