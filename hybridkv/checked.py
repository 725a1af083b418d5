"""Checked mode: the spec invariants asserted on the runtime state after every call.

What is checked, and how (DESIGN §5):
  * spec functions on a view of the runtime: ``admission_cap`` and ``draft_isolation``
    (every pool's records as the view's memory), and per object the spec's own
    ``_complete`` (published objects are whole) and ``_sound_at`` (hit soundness: what a
    running or holding request reads is pinned, not a draft, and covers the position it is
    read at, indexer version included);
  * TOCTOU (I3): every read of a RUNNING request still matches the version and epoch it
    checked; pins equal their holders (requests' reads + object-driver holders);
  * state routing (I2): every published key maps to a live block of its own pool, each block
    at most once; the policy's eligible set holds only unpinned published blocks of that pool;
  * pool integrity (free lists, counters, alignment, checked-mode shadows).
The full abstract mapping (runtime -> spec Sys, every INVARIANT) is used by the object
driver's small configuration (hybridkv.driver.ObjectDriver.abstract) in the conformance test.
"""
from types import SimpleNamespace

from hybridkv.errors import InvariantViolation
from spec import invariants as inv
from spec.common import FREE, PINNED, READY, STALE
from spec.state import HELD, KINDS, RUNNING

KIDX = {k: i for i, k in enumerate(KINDS)}


def _fail(name, detail):
    raise InvariantViolation(name, detail)


def check_all(mgr):
    drv = mgr.object_driver
    if drv is not None and getattr(mgr, "spec_cfg", None) is not None:
        sys_state = drv.abstract()                   # small config: the full abstract state
        for name, fn in inv.INVARIANTS.items():
            if not fn(sys_state, mgr.spec_cfg):
                _fail(name, "on the abstract state")
    for pk, pool in mgr.pools.items():
        bad = pool.check_integrity()
        if bad:
            _fail("pool_integrity", (pk, bad[:3]))
    view = SimpleNamespace(mem=tuple(tuple(p.recs) for p in mgr.pools.values()),
                           disk=tuple(mgr.object_driver.state.disk) if mgr.object_driver else (),
                           miv=mgr.miv)
    if not inv.admission_cap(view, SimpleNamespace(cap=mgr.cap)):
        _fail("admission_cap", mgr.cap)
    if not inv.draft_isolation(view, None):
        _fail("draft_isolation", "")
    holders = {}
    for req in mgr.reqs.values():
        for r in req.reads:
            holders[r.ref] = holders.get(r.ref, 0) + 1
            if req.phase in (HELD, RUNNING):
                _check_read(mgr, req, r, view)
    if mgr.object_driver is not None:
        for ref, n in mgr.object_driver.holders().items():
            holders[ref] = holders.get(ref, 0) + n
    for (kind, g), pool in mgr.pools.items():
        cx = mgr.ctx[g]
        for b, o in enumerate(pool.recs):
            ref = (kind, g, b)
            if o.pins != holders.get(ref, 0):
                _fail("pins_are_holders", (ref, o.pins, holders.get(ref, 0)))
            if o.st in (READY, PINNED, STALE) and not inv._complete(KIDX[kind], o, cx):
                _fail("published_complete", (ref, o))
            if kind == "idx" and (o.iv > mgr.miv or (o.st == STALE and o.iv == mgr.miv)):
                _fail("indexer_version", (ref, o))
        _check_routing(mgr, kind, g, pool)


def _check_read(mgr, req, r, view):
    pool = mgr.pools[(r.ref.kind, r.ref.group)]
    o = pool.recs[r.ref.block]
    cx = mgr.ctx[r.ref.group]
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
    for b in mgr.evictable[(kind, g)]:
        st = pool.recs[b].st
        if st not in (READY, STALE) or b not in mgr.admitted[(kind, g)]:
            _fail("eviction_routing", (kind, g, b, st))
