"""The disk side of a lookup: what an object on disk is called, which resume points exist only
partly in memory, and the cost model's choice per group.

Nothing here makes an object reusable: a disk copy counts only once a load verified it and its
block is published in memory (hybridkv.cache.disklink.DiskLink); the funnel then checks it like
any other object.
"""
import hashlib
from types import MappingProxyType
from typing import NamedTuple

from hybridkv.cache.pool import ObjRef

DISK_KIND = {"comp": "compressed_kv", "tail": "tail", "swa": "swa", "idx": "indexer"}


class DiskRead(NamedTuple):
    """One object a resume at H needs that is on disk, not in memory."""
    H: int
    group: str
    kind: str
    at: int
    exact: bool
    ikey: bytes        # chain key the object is filed under in the index
    state: str         # on_disk | verified | loading
    nbytes: int


class Load(NamedTuple):
    """One load in flight: its block is LOADING; the verified bytes land in ``staging``."""
    ref: ObjRef
    read: DiskRead
    key: str           # disk key
    handle: object
    staging: object
    content: tuple     # the spec record content the copy holds (fixed when the load started)
    keys: object       # the chain keys of the prompt that asked for it (parents, anchors)


def disk_key(ikey, group, exact, kind):
    """Disk key of the object filed under chain key ``ikey`` in pool (kind, group); ``kind``
    carries the indexer version for indexer objects (``idx@v``).  The chain key already
    carries the tenant salt, the layout id and the model version."""
    role = b"ckpt" if exact else b"chain"
    return hashlib.blake2b(ikey + b"|" + group.encode() + b"|" + role + b"|" + kind.encode(),
                           digest_size=16).hexdigest()


def choose(cost_model, reads, start, n_tokens, left_of):
    """load | wait | recompute for getting ``reads`` back versus recomputing ``n_tokens``
    tokens after ``start`` (without a cost model: load, or wait when all are loading)."""
    loading = [r for r in reads if r.state == "loading"]
    rest = sum(r.nbytes for r in reads if r.state != "loading")
    left = sum(left_of(r) for r in loading)
    if cost_model is None:
        return "wait" if loading and not rest else "load"
    if loading and not rest:
        return cost_model.decide(0, start, n_tokens, left).choice.value
    return cost_model.decide(rest + left, start, n_tokens).choice.value


def decide(cost_model, reads, start, H, left_of):
    """(overall choice, {group: choice}) for the disk part of a resume at H."""
    groups = {}
    for r in reads:
        groups.setdefault(r.group, []).append(r)
    per = {g: choose(cost_model, rs, start, H - start, left_of) for g, rs in groups.items()}
    return choose(cost_model, reads, start, H - start, left_of), MappingProxyType(per)
