"""Checked mode: the spec invariants asserted on the runtime state after every call.

What is checked, and how (DESIGN §5):
  * spec functions on the pool records: ``draft_isolation`` and ``accounting`` (a readable
    object is published, a free or loading one is not), the spec's ``_complete`` (published
    objects are whole) and ``_sound_at`` (hit soundness: what a running request reads is
    pinned, not a draft, covers the position it is read at, indexer version included);
  * I1: objects in transit within the cap (spec funnel.can_admit_objects);
  * I3 TOCTOU: every read of a RUNNING request still has the version and epoch it checked;
    pins equal their holders (requests' reads, other registered holders);
  * runtime accounting: every non-free block is exactly one of held by a live request (read,
    or being written as its own object), loading, published and cached (evictable or dead),
    or the protected provisional end snapshot of a live request -- so a leak or an object no
    lookup can reach is a violation;
  * routing: index maps and tree relations agree (PrefixIndex.check), the evictor's sets hold
    only what they say (Evictor.check), every LOADING block has exactly one load;
  * pool integrity (free bookkeeping, counters, alignment, checked-mode shadows);
  * arena mode: page routing (Arena.check: a held block's page is its pool's, no page held
    twice, free pages have no owner).

Two depths.  ``check_all`` (``check_invariants()``) sweeps every block.  ``check_call`` runs
after every outermost public call on the blocks the call touched (``Pool.touched``) and the
requests it named, plus the global counters; every ``check_every`` calls the full sweep.
The full abstract mapping (runtime -> spec Sys, every INVARIANT) is used by the object
driver's small configuration (hybridkv.testing.driver.ObjectDriver.abstract).
"""
import functools
from types import SimpleNamespace

from hybridkv.errors import InvariantViolation
from spec import invariants as inv
from spec.common import LOADING, PINNED, READY, STALE, WRITING
from spec.funnel import can_admit_objects
from spec.state import KINDS, RUNNING

KIDX = {k: i for i, k in enumerate(KINDS)}


def locked(fn):
    """Every public call runs under the manager's re-entrant lock; in checked mode the
    outermost call asserts the invariants before releasing it."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            if not self.checked:
                return fn(self, *args, **kwargs)
            ck = self.checker
            ck.depth += 1
            try:
                out = fn(self, *args, **kwargs)
            finally:
                ck.depth -= 1
            if args and isinstance(args[0], (str, int)):
                ck.named.add(args[0])
            if not ck.depth:
                ck.check_call()
            return out
    return wrapper


def _fail(name, detail):
    raise InvariantViolation(name, detail)


class Checker:
    def __init__(self, mgr, check_every=64):
        self.mgr, self.check_every = mgr, check_every
        self.depth, self.calls, self.last_checked = 0, 0, 0
        self.named = set()          # request ids the calls since the last check named

    # -- who holds what ------------------------------------------------------------------------
    def pin_holders(self):
        """(kind, group, block) -> pins held by requests' reads and other holders."""
        out = {}
        for req in self.mgr.requests.values():
            for r in req.reads:
                out[tuple(r.ref)] = out.get(tuple(r.ref), 0) + 1
        for h in self.mgr.holders:
            for ref, n in h.holders().items():
                out[ref] = out.get(ref, 0) + n
        return out

    def owners(self):
        """(kind, group, block) -> what holds it besides pins: 'own' (a live request writes
        it), 'provisional' (a live request's unsealed-retention end snapshot), 'load'."""
        out = {}
        for req in self.mgr.requests.values():
            own = list(req.working_objects())
            for P in req.pending_points:
                own += req.snapshots.get(P, [])
            for o in own:
                out[tuple(o.ref)] = "own"
            if req.sealed_points and req.snapshot_tags.get(req.sealed_points[-1]) == {"end"}:
                for o in req.snapshots.get(req.sealed_points[-1], ()):
                    out.setdefault(tuple(o.ref), "provisional")
        link = self.mgr.disk_link
        if link is not None:
            for ref in link.loading_blocks():
                out[tuple(ref)] = "load"
        for h in self.mgr.holders:
            for ref in h.owned():
                out[ref] = "external"
        return out

    # -- per block ---------------------------------------------------------------------------
    def _block(self, kind, g, pool, b, pins, owners, miv):
        o = pool.recs[b]
        ref = (kind, g, b)
        view = SimpleNamespace(mem=((o,),))
        if o.pins != pins.get(ref, 0):
            _fail("pins_are_holders", (ref, o.pins, pins.get(ref, 0)))
        if not inv.draft_isolation(view, None):
            _fail("draft_isolation", (ref, o))
        if not inv.accounting(view, None):
            _fail("accounting", (ref, o))
        if o.st in (READY, PINNED, STALE) and not inv._complete(KIDX[kind], o, self.mgr.ctx[g]):
            _fail("published_complete", (ref, o))
        if kind == "idx" and (o.iv > miv or (o.st == STALE and o.iv == miv)):
            _fail("indexer_version", (ref, o))
        who = owners.get(ref)
        published = self.mgr.index.published(kind, g, b)
        if bool(o.pub) != published and who != "external":
            _fail("state_routing", ("publication bit vs index", ref, o.pub, published))
        ev = self.mgr.evictor
        if o.st == WRITING and who not in ("own", "external"):
            _fail("accounting", ("writing block with no live writer", ref))
        if o.st == LOADING and who not in ("load", "external"):
            _fail("accounting", ("loading block with no load", ref))
        if o.st in (READY, STALE) and b not in ev.cached[(kind, g)] and who is None:
            _fail("accounting", ("cached block neither evictable nor held", ref, o))

    # -- depths --------------------------------------------------------------------------------
    def _globals(self):
        mgr = self.mgr
        n = mgr.admission.in_transit()
        if not can_admit_objects(n, 0, mgr.admission.cap):
            _fail("admission_cap", (n, mgr.admission.cap))

    def _reads(self, named=None):
        mgr = self.mgr
        for rid, req in mgr.requests.items():
            if req.phase != RUNNING or (named is not None and rid not in named):
                continue
            H = req.plan.reuse_tokens
            if H % mgr.layout.granule:
                _fail("hit_alignment", (rid, H))
            for r in req.reads:
                o = mgr.pools[(r.ref.kind, r.ref.group)].recs[r.ref.block]
                if not inv._sound_at(KIDX[r.ref.kind], o, r.at, SimpleNamespace(miv=mgr.miv),
                                     mgr.ctx[r.ref.group]):
                    _fail("hit_soundness", (rid, r, o))
                if o.st != PINNED or o.ver != r.ver or o.ep != r.ep:
                    _fail("toctou", (rid, r, o))

    def check_all(self):
        mgr = self.mgr
        self._small()
        for pk, pool in mgr.pools.items():
            bad = pool.check_integrity()
            if bad:
                _fail("pool_integrity", (pk, bad[:3]))
        bad = mgr.index.check(mgr.pools) + mgr.evictor.check() + \
            mgr.snapshots.check(mgr.requests.values())
        if mgr.arena is not None:
            bad += mgr.arena.check(mgr.pools)
        if bad:
            _fail("state_routing", bad[:3])
        self._globals()
        self._reads()
        pins, owners = self.pin_holders(), self.owners()
        for (kind, g), pool in mgr.pools.items():
            for b in range(pool.n):
                self._block(kind, g, pool, b, pins, owners, mgr.miv)
            pool.touched.clear()
        if mgr.disk_link is not None:
            mgr.disk_link.check()
        self.named.clear()

    def check_call(self):
        """After one public call: the touched state, or every ``check_every`` calls all."""
        mgr = self.mgr
        self.calls += 1
        if (self.check_every and self.calls % self.check_every == 0) or \
                getattr(mgr, "spec_cfg", None) is not None:
            return self.check_all()
        self._globals()
        self._reads(self.named)
        pins, owners = self.pin_holders(), self.owners()
        for (kind, g), pool in mgr.pools.items():
            if not pool.touched:
                continue
            bs = pool.touched
            bad = pool.check_blocks(bs)
            if bad:
                _fail("pool_integrity", ((kind, g), bad[:3]))
            if not 0 <= pool.n_free <= pool.n or not 0 <= pool.n_writing <= pool.n:
                _fail("pool_integrity", ((kind, g), pool.n_free, pool.n_writing))
            for b in bs:
                self._block(kind, g, pool, b, pins, owners, mgr.miv)
            self.last_checked += len(bs)
            bs.clear()
        self.named.clear()

    def _small(self):
        """The object driver's small configuration: the whole abstract state, every
        spec INVARIANT."""
        for h in self.mgr.holders:
            sys_state, cfg = h.abstract_state()
            for name, fn in inv.INVARIANTS.items():
                if not fn(sys_state, cfg):
                    _fail(name, "on the abstract state")
