"""The disk side of a lookup: which resume points exist only partly in memory, which of
their objects are on disk (or loading), and the cost model's choice per group.

Nothing here makes an object reusable: a disk copy counts only once a load verified it and
the block is published in memory (hybridkv.spill.DiskLink.reap); the funnel then checks it
like any other object.  Probing reads state only (no load, no policy access).
"""
import hashlib
from types import MappingProxyType
from typing import NamedTuple

from hybridkv.index import obj_key
from hybridkv.pools import ObjRef

ON_DISK_STATES = ("on_disk", "verified", "loading")
NO_GROUPS = MappingProxyType({})
DISK_KIND = {"comp": "compressed_kv", "tail": "tail", "swa": "swa", "idx": "indexer"}


class DiskRead(NamedTuple):
    """One object a resume at H needs that is on disk, not in memory."""
    H: int
    group: str
    kind: str
    at: int
    key: str           # disk key (hex)
    ikey: bytes        # index object key it is published under once verified
    state: str         # on_disk | verified | loading
    nbytes: int


class Load(NamedTuple):
    """One load in flight (hybridkv.spill.DiskLink.loads): its block is LOADING."""
    ref: ObjRef
    ikey: bytes
    at: int
    handle: object
    nbytes: int
    ckpt: object       # Checkpoint to record once verified (exact objects), or None


def disk_key(ikey, kind):
    return hashlib.blake2b(ikey + b"|" + kind.encode(), digest_size=16).hexdigest()


def probe(link, n, H):
    """DiskRead for Need ``n`` of a resume at H when a copy is on disk or loading, else None."""
    key = link.key_for(n.key, n.kind)
    ld = link.loads.get(key)
    if ld is not None:
        return DiskRead(H, n.group, n.kind, n.at, key, n.key, "loading", ld.nbytes)
    try:
        p = link.tier.probe(key)
    except Exception:                      # a disk fault is a miss, never the caller's problem
        return None
    if p.state not in ON_DISK_STATES:
        return None
    return DiskRead(H, n.group, n.kind, n.at, key, n.key, p.state, p.nbytes)


def disk_candidates(mgr, link, keys, limit):
    """Aligned H <= limit * granule without a checkpoint record whose first group's window
    snapshot is in memory or on disk (e.g. spilled by an earlier process)."""
    g0, gran, out = mgr.layout.groups[0], mgr.layout.granule, []
    link.maybe_on_disk("")                          # refresh the listing when it is due
    if not link.known and not link.loads:
        return out                                  # nothing on disk: skip the hashing
    kind = "swa" if "swa" in g0.kinds else "tail"
    objs = mgr.index.objs[(kind, g0.name)]
    for i in range(limit):
        if keys[i] in mgr.index.ckpts:
            continue
        ik = obj_key(keys[i], g0.name, b"ckpt")
        if ik in objs or link.maybe_on_disk(link.key_for(ik, kind)):
            out.append((i + 1) * gran)
    return out


def _left(link, r):
    ld = link.loads.get(r.key)
    if ld is None:
        return r.nbytes
    return max(0, ld.nbytes - ld.handle.progress)


def choose(link, reads, start, n_tokens):
    """load | wait | recompute for getting ``reads`` back versus recomputing ``n_tokens``
    tokens after ``start`` (the tier's cost model; without one: load, or wait when every
    object is already loading)."""
    loading = [r for r in reads if r.state == "loading"]
    rest = sum(r.nbytes for r in reads if r.state != "loading")
    left = sum(_left(link, r) for r in loading)
    cm = link.tier.cost_model
    if cm is None:
        return "wait" if loading and not rest else "load"
    if loading and not rest:
        return cm.decide(0, start, n_tokens, left).choice.value
    return cm.decide(rest + left, start, n_tokens).choice.value


def decide(link, reads, start, H):
    """(overall choice, {group: choice}) for the disk part of a resume at H."""
    groups = {}
    for r in reads:
        groups.setdefault(r.group, []).append(r)
    per = {g: choose(link, rs, start, H - start) for g, rs in groups.items()}
    return choose(link, reads, start, H - start), MappingProxyType(per)
