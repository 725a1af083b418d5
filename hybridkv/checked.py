"""Checked mode: the spec invariants asserted on the runtime state after every call.

What is checked, and how (DESIGN §5):
  * spec functions on a view of the runtime: ``admission_cap`` and ``draft_isolation``
    (pool records as the view's memory), and per object the spec's own ``_complete``
    (published objects are whole) and ``_sound_at`` (hit soundness: what a running or holding
    request reads is pinned, not a draft, and covers the position it is read at, indexer
    version included);
  * TOCTOU (I3): every read of a RUNNING request still matches the version and epoch it
    checked; pins equal their holders (requests' reads + object-driver holders);
  * state routing (I2): every published key maps to a live block of its own pool, each block
    at most once; the policy's eligible set holds only unpinned published blocks of that pool;
    a LOADING block has exactly one load (disk tier);
  * pool integrity (free flags, counters, alignment, checked-mode shadows).

Two depths.  ``check_all`` (``check_invariants()``) sweeps every block.  ``check_call`` runs
after every public call: the blocks the call touched (``Pool.touched``: every event fired,
every index / policy change) get every per-object check, the requests reading them and the
global counters get theirs -- O(touched + live reads), not O(pool size); every
``mgr.check_every`` calls it runs the full sweep instead.
The full abstract mapping (runtime -> spec Sys, every INVARIANT) is used by the object
driver's small configuration (hybridkv.driver.ObjectDriver.abstract) in the conformance test.
"""
from types import SimpleNamespace

from hybridkv.errors import InvariantViolation
from spec import invariants as inv
from spec.common import FREE, LOADING, PINNED, READY, STALE, WRITING
from spec.state import HELD, KINDS, RUNNING

KIDX = {k: i for i, k in enumerate(KINDS)}
_W = (SimpleNamespace(st=WRITING, draft=0),)


def _fail(name, detail):
    raise InvariantViolation(name, detail)


def _small(mgr):
    """The object driver's small configuration: the whole abstract state, every INVARIANT."""
    drv = mgr.object_driver
    if drv is None or getattr(mgr, "spec_cfg", None) is None:
        return False
    sys_state = drv.abstract()
    for name, fn in inv.INVARIANTS.items():
        if not fn(sys_state, mgr.spec_cfg):
            _fail(name, "on the abstract state")
    return True


def _holders(mgr):
    """ref -> pins held by requests' reads and object-driver holders."""
    holders = {}
    for req in mgr.reqs.values():
        for r in req.reads:
            holders[r.ref] = holders.get(r.ref, 0) + 1
    if mgr.object_driver is not None:
        for ref, n in mgr.object_driver.holders().items():
            holders[ref] = holders.get(ref, 0) + n
    return holders


def _check_reads(mgr, refs=None):
    for req in mgr.reqs.values():
        if req.phase in (HELD, RUNNING):
            for r in req.reads:
                if refs is None or r.ref in refs:
                    _check_read(mgr, req, r)


def _transit(mgr):
    """spec admission_cap on a view holding the runtime's in-transit count."""
    n = sum(p.n_writing for p in mgr.pools.values()) + mgr.disk_transit()
    if not inv.admission_cap(SimpleNamespace(mem=(_W * n,), disk=()), SimpleNamespace(cap=mgr.cap)):
        _fail("admission_cap", (n, mgr.cap))


def _check_block(mgr, kind, g, pool, b, holders, cx):
    o = pool.recs[b]
    ref = (kind, g, b)
    if o.pins != holders.get(ref, 0):
        _fail("pins_are_holders", (ref, o.pins, holders.get(ref, 0)))
    if o.draft and o.st != WRITING:
        _fail("draft_isolation", (ref, o))
    if o.st in (READY, PINNED, STALE) and not inv._complete(KIDX[kind], o, cx):
        _fail("published_complete", (ref, o))
    if kind == "idx" and (o.iv > mgr.miv or (o.st == STALE and o.iv == mgr.miv)):
        _fail("indexer_version", (ref, o))
    key = mgr.index.key_of[(kind, g)].get(b)
    if key is not None and (o.st == FREE or mgr.index.objs[(kind, g)].get(key) != b):
        _fail("state_routing", ("published block", kind, g, b, o.st))
    if b in mgr.evictable[(kind, g)] and (o.st not in (READY, STALE)
                                          or b not in mgr.admitted[(kind, g)]):
        _fail("eviction_routing", (kind, g, b, o.st))


def _pool_problems(pk, bad):
    if bad:
        _fail("pool_integrity", (pk, bad[:3]))


def check_all(mgr):
    _small(mgr)
    for pk, pool in mgr.pools.items():
        _pool_problems(pk, pool.check_integrity())
    view = SimpleNamespace(mem=tuple(tuple(p.recs) for p in mgr.pools.values()))
    if not inv.draft_isolation(view, None):
        _fail("draft_isolation", "")
    _transit(mgr)
    _check_reads(mgr)
    holders = _holders(mgr)
    for (kind, g), pool in mgr.pools.items():
        cx = mgr.ctx[g]
        for b in range(pool.n):
            _check_block(mgr, kind, g, pool, b, holders, cx)
        _check_routing(mgr, kind, g, pool)
        pool.touched.clear()
    if mgr.disk_link is not None:
        mgr.disk_link.check()


def check_call(mgr):
    """After one public call: the touched state, or every ``check_every`` calls all of it."""
    mgr.calls_checked = getattr(mgr, "calls_checked", 0) + 1
    every = getattr(mgr, "check_every", 0)
    if (every and mgr.calls_checked % every == 0) or getattr(mgr, "spec_cfg", None) is not None:
        return mgr.check_invariants()
    touched = {pk: pool.touched for pk, pool in mgr.pools.items() if pool.touched}
    refs = {(k, g, b) for (k, g), bs in touched.items() for b in bs}
    _transit(mgr)
    _check_reads(mgr, refs | _refs_of_calls(mgr))
    holders = _holders(mgr)
    link = mgr.disk_link
    loads = {}
    if link is not None:
        for key, ld in link.loads.items():
            loads[tuple(ld.ref)] = loads.get(tuple(ld.ref), 0) + 1
            if mgr.pools[(ld.ref.kind, ld.ref.group)].recs[ld.ref.block].st != LOADING:
                _fail("load_target", (key, ld.ref))
    for (kind, g), bs in touched.items():
        pool, cx = mgr.pools[(kind, g)], mgr.ctx[g]
        _pool_problems((kind, g), pool.check_blocks(bs))
        if not 0 <= pool.n_free <= pool.n or not 0 <= pool.n_writing <= pool.n:
            _fail("pool_integrity", ((kind, g), pool.n_free, pool.n_writing))
        if len(mgr.index.objs[(kind, g)]) != len(mgr.index.key_of[(kind, g)]):
            _fail("state_routing", ("index maps disagree", kind, g))
        for b in bs:
            _check_block(mgr, kind, g, pool, b, holders, cx)
            if link is not None and (pool.recs[b].st == LOADING) != (loads.get((kind, g, b)) == 1):
                _fail("state_routing_loads", ((kind, g, b), loads.get((kind, g, b), 0)))
        mgr.last_checked = getattr(mgr, "last_checked", 0) + len(bs)
        bs.clear()
    mgr.touched_reqs = set()


def _refs_of_calls(mgr):
    """Every read of the requests the checked calls named (they may not touch a block)."""
    out = set()
    for rid in getattr(mgr, "touched_reqs", ()):
        req = mgr.reqs.get(rid)
        if req is not None:
            out.update(r.ref for r in req.reads)
    return out


def _check_read(mgr, req, r):
    pool = mgr.pools[(r.ref.kind, r.ref.group)]
    o = pool.recs[r.ref.block]
    cx = mgr.ctx[r.ref.group]
    view = SimpleNamespace(miv=mgr.miv)
    if not inv._sound_at(KIDX[r.ref.kind], o, r.at, view, cx):
        _fail("hit_soundness", (req.rid, r, o))
    if req.phase == RUNNING and (o.st != PINNED or o.ver != r.ver or o.ep != r.ep):
        _fail("toctou", (req.rid, r, o))
    H = req.plan.reuse_tokens
    if H and H % mgr.layout.granule:
        _fail("hit_alignment", (req.rid, H))


def _check_routing(mgr, kind, g, pool):
    objs, key_of = mgr.index.objs[(kind, g)], mgr.index.key_of[(kind, g)]
    if len(objs) != len(key_of) or any(objs.get(k) != b for b, k in key_of.items()):
        _fail("state_routing", ("index maps disagree", kind, g))
    for b in key_of:
        if not 0 <= b < pool.n or pool.recs[b].st == FREE:
            _fail("state_routing", ("published free block", kind, g, b))
