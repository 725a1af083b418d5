"""Model checkpoints as files of the disk tier (real files: temp + fsync + rename, checksummed
header; hybridkv.disk.format).  Never pickle, never torch.load.

One object per (chain key, indexer version, model).  Payload: a flat uint8 tensor holding
  int64[3 + 3H]   FORMAT, H, n, the H prompt tokens, the n chunk bounds (a, b) padded with -1
                  to H pairs (every chunk has >= 1 token, so n <= H)
  float32 rows    per layer in order: swa_rows, comp, idx, tail.kv, tail.gate, idx_tail.kv,
                  idx_tail.gate (those the layer has)
Every size follows from (cfg, H) alone (model.cache.validate's rule), so the load destination
is preallocated before the tier reads a byte, and a file of another H cannot fit it.
DiskMeta: kind "tail" (model state kept outside the content-addressed pools), abi: a hash of
the format, the model's config and weights fingerprint and the indexer version; tok_hi = H.
A decoded checkpoint is re-validated (model.cache.validate) before it is offered.
"""
import hashlib
from typing import NamedTuple

import torch
import xxhash

from hybridkv.disk.format import DiskError, DiskMeta, abi_id
from hybridkv.model.cache import Checkpoint, CheckpointIncomplete, LayerCheckpoint, Tail, \
    tail_start, validate

FORMAT = 1
FIELDS = ("swa_rows", "comp", "idx", "tail.kv", "tail.gate", "idx_tail.kv", "idx_tail.gate")


class Decoded(NamedTuple):
    H: int
    tokens: tuple
    schedule: tuple
    ckpt: Checkpoint


class BadCheckpointFile(Exception):
    """A verified payload that does not decode to the checkpoint asked for; ``value``."""

    def __init__(self, what, value):
        self.value = value
        super().__init__(f"{what}: {value!r}")


def model_fingerprint(model):
    """Stable id of a V4Mini's config and weights (a checkpoint of other weights is another
    object)."""
    h = xxhash.xxh3_64()
    h.update(repr(model.cfg).encode())
    tensors = [model.emb, model.head] + [p[k] for p in model.layers for k in sorted(p)]
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.intdigest() >> 1


def layout_rows(cfg, H):
    """[(layer, field, rows, width)] of a checkpoint at H, in payload order."""
    out = []
    for layer, kind in enumerate(cfg.layers):
        out.append((layer, "swa_rows", H - max(0, H - cfg.window), cfg.head_dim))
        if kind != "swa":
            r = cfg.ratio(kind)
            out.append((layer, "comp", H // r, cfg.head_dim))
        if kind == "csa":
            out.append((layer, "idx", H // cfg.csa_ratio, cfg.idx_dim))
        if kind != "swa":
            ov, w = (r, 2 * cfg.head_dim) if kind == "csa" else (0, cfg.head_dim)
            n = H - tail_start(H, r, ov)
            out += [(layer, "tail.kv", n, w), (layer, "tail.gate", n, w)]
        if kind == "csa":
            r = cfg.csa_ratio
            n = H - tail_start(H, r, r)
            out += [(layer, "idx_tail.kv", n, 2 * cfg.idx_dim),
                    (layer, "idx_tail.gate", n, 2 * cfg.idx_dim)]
    return out


def payload_bytes(cfg, H):
    return 8 * (3 + 3 * H) + 4 * sum(n * w for _, _, n, w in layout_rows(cfg, H))


def disk_key(chain_key, miv, tag):
    return hashlib.blake2b(chain_key + b"|engine-ckpt|" + str((miv, tag)).encode(),
                           digest_size=16).hexdigest()


def meta(cfg, H, miv, tag):
    return DiskMeta("tail", abi_id(("hybridkv-engine-ckpt", FORMAT, repr(cfg), tag, miv)),
                    0, H)


def _field(lc, name):
    if "." in name:
        t = getattr(lc, name.split(".")[0])
        return None if t is None else getattr(t, name.split(".")[1])
    return getattr(lc, name)


def encode(ckpt, tokens, schedule):
    """The payload (uint8 tensor) of ``ckpt`` computed from ``tokens`` with ``schedule``."""
    H = ckpt.H
    if len(tokens) != H or not schedule or len(schedule) > H or schedule[-1][1] != H:
        raise BadCheckpointFile("tokens/schedule do not describe H", (H, len(tokens)))
    pad = [x for ab in schedule for x in ab] + [-1] * (2 * (H - len(schedule)))
    ints = torch.tensor([FORMAT, H, len(schedule), *tokens, *pad], dtype=torch.int64)
    rows = [_field(ckpt.layers[layer], f).detach().cpu().reshape(-1)
            for layer, f, _, _ in layout_rows_for(ckpt)]
    floats = torch.cat(rows) if rows else torch.zeros(0)
    return torch.cat([ints.view(torch.uint8), floats.float().contiguous().view(torch.uint8)])


def layout_rows_for(ckpt):
    """Payload order for an in-memory checkpoint (same order as layout_rows)."""
    out = []
    for layer, lc in enumerate(ckpt.layers):
        for f in FIELDS:
            if _field(lc, f) is not None:
                out.append((layer, f, None, None))
    return out


def decode(cfg, buf, H, device="cpu"):
    """Decoded checkpoint from a verified payload; raises BadCheckpointFile."""
    ni = 3 + 3 * H
    if buf.numel() != payload_bytes(cfg, H):
        raise BadCheckpointFile("payload size", (buf.numel(), payload_bytes(cfg, H)))
    ints = buf[:8 * ni].view(torch.int64).tolist()
    fmt, h, n = ints[:3]
    if (fmt, h) != (FORMAT, H) or not 0 < n <= H:
        raise BadCheckpointFile("payload preamble", (fmt, h, n))
    tokens = tuple(ints[3:3 + H])
    flat = ints[3 + H:3 + H + 2 * n]
    sched = tuple(zip(flat[0::2], flat[1::2]))
    if sched[0][0] != 0 or sched[-1][1] != H or \
            any(b != a2 or b <= a for (a, b), (a2, _) in zip(sched, sched[1:] + ((H, 0),))):
        raise BadCheckpointFile("schedule does not tile [0, H)", sched)
    floats, off = buf[8 * ni:].view(torch.float32), 0
    parts = [dict() for _ in cfg.layers]
    for layer, f, rows, w in layout_rows(cfg, H):
        parts[layer][f] = floats[off:off + rows * w].reshape(rows, w).clone().to(device)
        off += rows * w
    layers = []
    for layer, (kind, p) in enumerate(zip(cfg.layers, parts)):
        tail = idx_tail = None
        if kind != "swa":
            r = cfg.ratio(kind)
            tail = Tail(tail_start(H, r, r if kind == "csa" else 0), p["tail.kv"],
                        p["tail.gate"])
        if kind == "csa":
            r = cfg.csa_ratio
            idx_tail = Tail(tail_start(H, r, r), p["idx_tail.kv"], p["idx_tail.gate"])
        layers.append(LayerCheckpoint(max(0, H - cfg.window), p["swa_rows"], p.get("comp"),
                                      p.get("idx"), tail, idx_tail))
    ck = Checkpoint(H, tuple(layers))
    try:
        validate(cfg, ck)
    except CheckpointIncomplete as e:
        raise BadCheckpointFile("decoded checkpoint incomplete", str(e)) from None
    return Decoded(H, tokens, sched, ck)


def spill(tier, key, m, ckpt, tokens, schedule):
    """Write one checkpoint file; True when it is (or already was) on disk.  Disk trouble is
    a False, never an exception."""
    try:
        return tier.spill(key, encode(ckpt, tokens, schedule), m).ok
    except (DiskError, OSError, BadCheckpointFile):
        return False


def load(tier, cfg, key, m, H, device="cpu", timeout=10.0):
    """(Decoded or None, reason).  Only a header- and checksum-verified payload is decoded."""
    try:
        dest = torch.empty(payload_bytes(cfg, H), dtype=torch.uint8)
        r = tier.load(key, dest, m, timeout)
    except (DiskError, OSError) as e:
        return None, f"error: {type(e).__name__}"
    if not r.ok:
        return None, f"{r.status.value}: {r.reason}"
    try:
        return decode(cfg, dest, H, device), "verified"
    except BadCheckpointFile as e:
        return None, f"undecodable: {e}"
