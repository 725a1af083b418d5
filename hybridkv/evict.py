"""Eviction per (kind, group) pool, each with its own policy instance (never one global LRU
across kinds): which blocks are eligible (published, unpinned, admitted to the policy), taking
one out of the index and the policy (``drop``), and making room by evicting this pool's
victims only (``make_room``; with a disk tier each victim worth keeping is spilled first).
Every block change fires through the pool (compiled tables + spec guards); checked mode
learns of index / policy changes through ``Pool.touch``."""
from hybridkv.errors import AdmissionRefused
from hybridkv.policy import EntryMeta
from hybridkv.pools import ObjRef
from spec.common import READY, STALE


def make_eligible(mgr, ref):
    pk = (ref.kind, ref.group)
    b = ref.block
    if b in mgr.admitted[pk] and b not in mgr.evictable[pk] and \
            mgr.pools[pk].recs[b].st in (READY, STALE):
        mgr.policies[pk].eligible(b)
        mgr.evictable[pk].add(b)
        mgr.pools[pk].touch(b)


def make_ineligible(mgr, ref):
    pk = (ref.kind, ref.group)
    pool = mgr.pools[pk]
    if ref.block in mgr.evictable[pk]:
        mgr.policies[pk].ineligible(ref.block)
        mgr.evictable[pk].discard(ref.block)
        pool.touch(ref.block)


def admit_entry(mgr, ref, at, exact):
    pk = (ref.kind, ref.group)
    if ref.block in mgr.admitted[pk]:
        return
    pool = mgr.pools[pk]
    layers = len(mgr.layout.group(ref.group).layers)
    mgr.policies[pk].admit(EntryMeta(ref.block, "checkpoint" if exact else "block",
                                     pool.block_nbytes, float(at * layers), ref.kind), mgr.clock)
    mgr.admitted[pk].add(ref.block)
    pool.touch(ref.block)


def drop(mgr, ref, event="evict"):
    """Take a block out of the index and the policy and fire ``event`` (to FREE)."""
    pk = (ref.kind, ref.group)
    pool = mgr.pools[pk]
    if pool.recs[ref.block].st == STALE:
        event = "drop_stale"
    pool.fire(ref.block, event)
    mgr.index.unpublish(ref.kind, ref.group, ref.block)
    if ref.block in mgr.admitted[pk]:
        mgr.admitted[pk].discard(ref.block)
        mgr.evictable[pk].discard(ref.block)
        mgr.policies[pk].remove(ref.block, event != "reject")


def make_room(mgr, pk, k):
    """Evict this pool's victims (never another kind's) until k blocks are free; with a
    disk tier each victim worth keeping is spilled before it is evicted."""
    pool, pol = mgr.pools[pk], mgr.policies[pk]
    while pool.n_free < k:
        v = pol.victim()
        if v is None:
            raise AdmissionRefused("pool exhausted", {f"{pk[0]}/{pk[1]}": (k, pool.n_free)})
        ref = ObjRef(pk[0], pk[1], v)
        link = getattr(mgr, "disk_link", None)
        if link is not None:
            link.on_evict(ref)                 # spill first (source pinned meanwhile)
        drop(mgr, ref)
        mgr.metrics.evicted(pk[0])
