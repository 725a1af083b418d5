"""Model layout: explicit layer groups, the pools each group needs, and ``objects_at(H)``.

A ``LayerGroup`` is a set of layers with one attention kind that share block tables:
``swa`` (sliding window only; with ``chunk`` chunked-local attention: a query reads its own
chunk, the window is the chunk), ``csa`` (ratio-m compression with overlap, optional lightning
indexer), ``hca`` (ratio-m' compression, no overlap) or ``full`` (paged attention over every
token: a compressed chain of ratio 1 with no window, as in homogeneous models and the full
layers of full+SWA hybrids).  Object kinds per group (spec kinds): ``swa`` for every group with
a window; ``comp`` and ``tail`` for csa/hca; ``idx`` when the group has an indexer; ``comp``
alone for full.

Pools (one per (kind, group)) hold, per block and per layer of the group, the rows the model
reads and writes (``pool_tensors``):
  comp  ``kv`` [entries, head_dim]: E = block_size / ratio compressed entries of one chain
        block (full: the raw KV rows of block_size tokens);
  swa   ``kv`` [window, head_dim]: one window page (positions [j*W, (j+1)*W), row = pos % W)
        or one window snapshot (rows [H-W, H) in the same ring order);
  tail  ``rows`` [m - 1 + overlap, 2 * width]: the compressor's open window (kv | gate);
  idx   ``keys`` [entries, idx_dim]: indexer keys of a chain block, and ``tail``
        [2r - 1, 4 * idx_dim]: the indexer compressor's open window (kv | gate).
A layer's view of a pool tensor is ``[blocks, rows, dim]``; its ``AbiDesc`` (``abi``) is what
the lookup's layer 2 compares stored objects against and what a kernel launch checks the
tensor against (spec.funnel.pool_abi: one vocabulary).

Hit alignment: the prefix index hashes the prompt in granules of GCD(group block sizes); a
resume point H sits on the granule and, per group, on its block boundary or at a position
that group checkpointed exactly (spec.funnel.can_hit_aligned).
"""
import math
import warnings
from typing import NamedTuple

from hybridkv.errors import LayoutError, LayoutWarning
from spec.funnel import GPU_BLOCK_ALIGN, pool_abi
from spec.swa import first_read as swa_first_read
from spec.tail import needs_snapshot as needs_tail_snapshot

KINDS = ("comp", "tail", "swa", "idx")       # spec.state.KINDS order
CHAIN_KINDS = ("comp", "idx")                # kinds with shared chain blocks
GROUP_KINDS = ("swa", "csa", "hca", "full")
LCM_WARN_TOKENS = 4096
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
KERNEL_READ = {"comp": "kv", "swa": "kv", "idx": "keys", "tail": "rows"}


def ceil_div(a, b):
    """a / b rounded up (non-negative a, positive b): blocks, pages or granules covering a."""
    return -(-a // b)


class LayerGroup(NamedTuple):
    name: str
    kind: str                 # "swa" | "csa" | "hca" | "full"
    layers: tuple             # layer indices of the model
    block_size: int           # tokens per block of this group (its page / hash unit)
    window: int               # SWA window W (0 for full)
    ratio: int = 1            # compression ratio m (1 for swa and full)
    overlap: int = 0          # CSA overlap rows (m), 0 for HCA
    head_dim: int = 16
    idx_dim: int = 0          # > 0: the group has a lightning indexer
    dtype: str = "float32"
    chunk: int = 0            # > 0 (an swa group, window == chunk): chunked-local attention

    def first_read(self, H):
        """The oldest position a resume at H needs of the window (spec.swa.first_read)."""
        return swa_first_read(H, self)

    def oldest_read(self, L):
        """The oldest position a query at L or later reads: L - W + 1 under a sliding window,
        L's chunk start under chunked-local attention (a window page holds one chunk)."""
        return L - L % self.chunk if self.chunk else L - self.window + 1

    def slide_at(self, X):
        """The least settled position L from which no query reads below X (``oldest_read``
        reaches X)."""
        return ceil_div(X, self.chunk) * self.chunk if self.chunk else X + self.window - 1

    @property
    def compressed(self):
        """csa / hca: the group keeps a compressor tail."""
        return self.kind in ("csa", "hca")

    @property
    def kinds(self):
        return _GROUP_KINDS[(self.kind, bool(self.idx_dim))]

    @property
    def entries_per_block(self):
        return self.block_size // self.ratio


_GROUP_KINDS = {("swa", False): ("swa",), ("full", False): ("comp",),
                ("csa", False): ("comp", "tail", "swa"),
                ("csa", True): ("comp", "tail", "swa", "idx"),
                ("hca", False): ("comp", "tail", "swa")}


class ObjSpec(NamedTuple):
    """One object of a checkpoint (``ModelLayout.objects_at``)."""
    kind: str
    group: str
    at: int          # position it must cover (spec covers(o, at, c))
    exact: bool      # exists only at exactly ``at`` (a snapshot), else a chain block ending there


def _pos_int(name, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise LayoutError(f"{name} must be an int >= {minimum}", v)


def _check_group(g):
    if not isinstance(g, LayerGroup):
        raise LayoutError("groups must be LayerGroup", g)
    if not isinstance(g.name, str) or not g.name:
        raise LayoutError("group name must be a non-empty str", g.name)
    if g.kind not in GROUP_KINDS:
        raise LayoutError(f"group kind must be one of {GROUP_KINDS}", g.kind)
    if not isinstance(g.layers, tuple) or not g.layers:
        raise LayoutError("layers must be a non-empty tuple", g.layers)
    for name in ("block_size", "ratio", "head_dim"):
        _pos_int(f"{g.name}.{name}", getattr(g, name))
    _pos_int(f"{g.name}.window", g.window, 0 if g.kind == "full" else 1)
    _pos_int(f"{g.name}.idx_dim", g.idx_dim, 0)
    if g.dtype not in ITEMSIZE:
        raise LayoutError(f"dtype must be one of {tuple(ITEMSIZE)}", g.dtype)
    if g.kind in ("swa", "full") and (g.ratio != 1 or g.overlap or g.idx_dim):
        raise LayoutError(f"a {g.kind} group has ratio 1, no overlap, no indexer", g)
    if g.kind == "full" and g.window:
        raise LayoutError("a full group has no window (window=0)", g.window)
    if g.block_size % g.ratio:
        raise LayoutError("block_size must be a multiple of the ratio", (g.block_size, g.ratio))
    if g.kind == "hca" and (g.overlap or g.idx_dim):
        raise LayoutError("an hca group has no overlap and no indexer", g)
    if g.kind == "csa" and g.overlap not in (0, g.ratio):
        raise LayoutError("csa overlap is 0 or the ratio", g.overlap)
    _pos_int(f"{g.name}.chunk", g.chunk, 0)
    if g.chunk and (g.kind != "swa" or g.window != g.chunk):
        raise LayoutError("chunked-local attention is an swa group whose window is the chunk",
                          (g.name, g.kind, g.window, g.chunk))


class ModelLayout:
    """Immutable description of the model's cache layout (see module docstring)."""

    def __init__(self, groups, name="custom", kernel_version=1, model_version="0", vocab=None):
        groups = tuple(groups)
        if not groups:
            raise LayoutError("a layout needs at least one group", groups)
        for g in groups:
            _check_group(g)
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise LayoutError("group names must be unique", names)
        layers = [i for g in groups for i in g.layers]
        if len(set(layers)) != len(layers):
            raise LayoutError("a layer belongs to exactly one group", layers)
        if vocab is not None:
            _pos_int("vocab", vocab)
        _pos_int("kernel_version", kernel_version, 0)
        self.groups, self.name, self.vocab = groups, name, vocab
        self._by_name = {g.name: g for g in groups}
        self.kernel_version, self.model_version = kernel_version, str(model_version)
        self.granule = math.gcd(*[g.block_size for g in groups])
        self.lcm = math.lcm(*[g.block_size for g in groups])
        self.layer_slot = {layer: (g.name, j) for g in groups for j, layer in enumerate(g.layers)}
        self._exact = {}
        self._pool_keys = tuple((k, g.name) for g in groups for k in KINDS if k in g.kinds)
        self._chain_pools = tuple(pk for pk in self._pool_keys if pk[0] in CHAIN_KINDS)
        self._id = repr((name, groups, kernel_version)).encode()    # (every lookup hashes it)
        if self.lcm > LCM_WARN_TOKENS:
            warnings.warn(f"layout {name}: LCM of group block sizes is {self.lcm} tokens; "
                          f"hits rely on exact checkpoints (granule {self.granule})",
                          LayoutWarning, stacklevel=2)

    def group(self, name):
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise LayoutError("no such group", name) from None

    def pool_keys(self):
        """(kind, group name) of every pool, in a fixed order."""
        return self._pool_keys

    def chain_pools(self):
        """(kind, group name) of every pool holding chain blocks."""
        return self._chain_pools

    # -- what a checkpoint is: the one rule ---------------------------------------------------
    def objects_at(self, H, since=0):
        """The objects a checkpoint at H consists of: per chained group its chain blocks
        (comp, idx) ending in (since, H], then the exact objects at H -- the open compressed
        block when H is off the group's block boundary, the tail when it holds rows at H
        (``spec.tail.needs_snapshot``: an HCA tail on its ratio's boundary is empty, the state
        a fresh tail written at H holds), the window, the indexer's object (partial keys + its
        own open window).  Used alike by the writer (what to write and publish) and the
        lookup (what must be cached and ready)."""
        out = []
        for g in self.groups:
            bs = g.block_size
            for kind in CHAIN_KINDS:
                if kind in g.kinds:
                    first = since // bs + 1
                    out += [ObjSpec(kind, g.name, e * bs, False) for e in range(first, H // bs + 1)]
            for kind in KINDS:
                if kind in g.kinds and (kind != "comp" or H % bs) and \
                        (kind != "tail" or needs_tail_snapshot(H, g)):
                    out.append(ObjSpec(kind, g.name, H, True))
        return out

    def exact_at(self, H):
        """The exact (snapshot) objects of a checkpoint at H: ``objects_at(H, since=H)``."""
        return [ObjSpec(kind, g, H, True) for kind, g in self.exact_kinds(H)]

    def exact_kinds(self, H):
        """(kind, group) of the exact objects at H (memoised by H mod LCM: which exist
        depends only on that)."""
        key = H % self.lcm
        got = self._exact.get(key)
        if got is None:
            got = self._exact[key] = tuple((o.kind, o.group) for o in self.objects_at(H, H))
        return got

    def windows_only(self, H):
        """Every exact object at H is a window: a commit that passes H without ending there
        can still capture it (``Snapshots.passable``; the vLLM adapter's commits pass it)."""
        return all(kind == "swa" for kind, _ in self.exact_kinds(H))

    @property
    def objectless(self):
        """No checkpoint has an exact object (full attention only): a block end is a
        checkpoint by its chain blocks alone, and nothing is captured between block ends."""
        return not any(self.exact_kinds(P) for P in range(self.granule, self.lcm + 1,
                                                          self.granule))

    # -- pools ----------------------------------------------------------------------------------
    def pool_tensors(self, kind, g):
        """name -> (rows, dim) of each tensor a block of pool (kind, g) has, per layer."""
        if isinstance(g, str):
            g = self.group(g)
        if kind == "comp":
            return {"kv": (g.entries_per_block, g.head_dim)}
        if kind == "swa":
            return {"kv": (g.window, g.head_dim)}
        if kind == "tail":
            width = 2 * g.head_dim if g.overlap else g.head_dim
            return {"rows": (g.ratio - 1 + g.overlap, 2 * width)}
        if kind == "idx":
            return {"keys": (g.entries_per_block, g.idx_dim),
                    "tail": (2 * g.ratio - 1, 4 * g.idx_dim)}
        raise LayoutError("no such object kind", kind)

    def abi(self, kind, g, kernel_version=None):
        """AbiDesc of one layer's view of the kernel-read tensor of pool (kind, g)."""
        if isinstance(g, str):
            g = self.group(g)
        rows, dim = self.pool_tensors(kind, g)[KERNEL_READ[kind]]
        kv = self.kernel_version if kernel_version is None else kernel_version
        return pool_abi(g.dtype, rows, dim, kv)

    def block_nbytes(self, kind, g):
        """Bytes one block of pool (kind, g) holds over every layer and tensor (the unit of
        spills, loads and capacity), each tensor's rows padded to GPU_BLOCK_ALIGN."""
        if isinstance(g, str):
            g = self.group(g)
        return sum(len(g.layers) * slot_bytes(rows, dim, g.dtype)
                   for rows, dim in self.pool_tensors(kind, g).values())

    # -- arena pages (hybridkv.cache.arena) ---------------------------------------------------
    def page_nbytes(self):
        """Bytes of one arena page: the largest block of any pool (every pool's block is
        padded up to it, so one page id space serves every kind)."""
        return max(self.block_nbytes(kind, g) for kind, g in self._pool_keys)

    def page_padding(self):
        """pool key -> fraction of a page its block leaves unused (padding waste per pool)."""
        page = self.page_nbytes()
        return {pk: 1 - self.block_nbytes(*pk) / page for pk in self._pool_keys}

    def layout_id(self):
        """Bytes naming the layout in every hash (so a different layout never hits): its
        name, groups and kernel version, fixed at construction."""
        return self._id

    def __repr__(self):
        return f"ModelLayout({self.name!r}, groups={[g.name for g in self.groups]})"

    # -- presets -----------------------------------------------------------------------------
    @classmethod
    def from_model(cls, cfg, name="v4-mini"):
        """The layout of a V4MiniConfig-like model config: its layer kinds, window, ratios,
        head and indexer dims; SWA groups page by ``swa_block`` tokens, compressed groups by
        ``comp_block`` entries of their ratio."""
        groups = []
        for kind in ("swa", "csa", "hca"):
            ids = tuple(i for i, k in enumerate(cfg.layers) if k == kind)
            if not ids:
                continue
            ratio = {"swa": 1, "csa": cfg.csa_ratio, "hca": cfg.hca_ratio}[kind]
            block = cfg.swa_block if kind == "swa" else cfg.comp_block * ratio
            groups.append(LayerGroup(kind, kind, ids, block, cfg.window, ratio,
                                     cfg.csa_ratio if kind == "csa" else 0, cfg.head_dim,
                                     cfg.idx_dim if kind == "csa" else 0))
        return cls(groups, name=name, vocab=cfg.vocab)

    @classmethod
    def from_vllm(cls, kv_cache_config):
        """The layout of a vLLM ``KVCacheConfig``: full attention, sliding-window and
        DeepSeek-V4's (compressed MLA, windowed MLA) groups, one hybridkv group per vLLM group
        (duck-typed on the spec classes; imports nothing from vLLM).  Any other spec raises
        ``hybridkv.integrations.vllm.UnsupportedSpec`` naming it."""
        from hybridkv.integrations.vllm.specs import layout_from_vllm
        return layout_from_vllm(kv_cache_config)

    @classmethod
    def v4_mini(cls, block_size=None, window=10, head_dim=16, idx_dim=8, csa_ratio=4,
                hca_ratio=8, vocab=256, layers=("swa", "csa", "hca", "csa", "hca")):
        """V4Mini's layout (hybridkv.model defaults: W=10, CSA m=4 with overlap + indexer,
        HCA m'=8; swa blocks of 6 tokens, compressed blocks of 4 entries).  ``block_size``
        sets every group's block to that many tokens instead (e.g. 512 for traces)."""
        bs = {"swa": 6, "csa": 4 * csa_ratio, "hca": 4 * hca_ratio}
        groups = []
        for kind in ("swa", "csa", "hca"):
            ids = tuple(i for i, k in enumerate(layers) if k == kind)
            if not ids:
                continue
            ratio = {"swa": 1, "csa": csa_ratio, "hca": hca_ratio}[kind]
            groups.append(LayerGroup(
                kind, kind, ids, block_size or bs[kind], window, ratio,
                csa_ratio if kind == "csa" else 0, head_dim,
                idx_dim if kind == "csa" else 0))
        return cls(groups, name="v4-mini", vocab=vocab)

    @classmethod
    def full(cls, block_size=16, head_dim=16, n_layers=4, vocab=None, window=None):
        """A homogeneous full-attention model (every layer paged over every token); with
        ``window`` a full+SWA hybrid (gpt-oss / Gemma style: alternate full and SWA layers)."""
        if window is None:
            return cls([LayerGroup("full", "full", tuple(range(n_layers)), block_size, 0,
                                   head_dim=head_dim)], name="full", vocab=vocab)
        return cls([LayerGroup("full", "full", tuple(range(0, n_layers, 2)), block_size, 0,
                               head_dim=head_dim),
                    LayerGroup("swa", "swa", tuple(range(1, n_layers, 2)), block_size, window,
                               head_dim=head_dim)], name="full+swa", vocab=vocab)


def slot_bytes(rows, dim, dtype):
    """Bytes of one block of one layer's tensor: dense rows padded to GPU_BLOCK_ALIGN."""
    raw = rows * dim * ITEMSIZE[dtype]
    return -(-raw // GPU_BLOCK_ALIGN) * GPU_BLOCK_ALIGN
