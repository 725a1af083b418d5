"""CacheManager methods: free, release of pins, indexer version bumps, stats, invariants,
and the disk tier's public face (prefetch, wait_loads, cancel_loads, spill_all)."""
import functools
from types import SimpleNamespace

from hybridkv import alloc as A
from hybridkv.checked import check_all
from hybridkv.errors import BadArgument, Refused
from hybridkv.calls import locked
from hybridkv.pools import ObjRef
from spec.common import FREE, LOADING, PINNED, READY, STALE, WRITING
from spec.system import can_bump_version

_ST = {FREE: "free", WRITING: "writing", READY: "ready", PINNED: "pinned", LOADING: "loading",
       STALE: "stale"}


def _release_reads(self, req):
    for r in req.reads:
        pk = (r.ref.kind, r.ref.group)
        self.pools[pk].fire(r.ref.block, "unpin")
        rec = self.pools[pk].recs[r.ref.block]          # (an outdated indexer is swept)
        if rec.st == READY:
            if self.index.published(r.ref.kind, r.ref.group, r.ref.block):
                A.make_eligible(self, r.ref)
            elif r.ref not in [x.ref for x in req.plan.reads]:
                A.drop(self, r.ref)                      # a private copy nobody can find
    req.reads = []


@locked
def free(self, request_id):
    """Release everything the request holds: unwritten objects are rejected, pins dropped;
    its last complete aligned snapshot stays as the request-end checkpoint."""
    req = self._req(request_id)
    for wo in req.drafts + req.own:
        A.drop(self, wo.ref, "reject")
    req.drafts, req.own, req.D = [], [], 0
    self._release_reads(req)
    done = [P for P, objs in req.snaps.items() if len(objs) == req.snap_count.get(P)]
    last = max(done) if done else None
    for P in list(req.snaps):
        if P == last or req.tags.get(P, set()) - {"end"}:
            for wo in req.snaps[P]:
                A.retain(self, req, wo)
        else:
            A.release_snapshot(self, req, P)
    del self.reqs[request_id]
    if len(self.index.ckpts) > 2 * sum(p.n for p in self.pools.values()):
        self.index.prune()


@locked
def bump_indexer_version(self, sweep=True):
    """New indexer weights: only at a quiescent point (spec can_bump_version).  Objects of
    the old version stop covering any H (spec indexer.covers); with ``sweep`` (the default)
    the ones no request holds go back to the free list now (spec mark_stale + drop_stale)
    and pinned ones as soon as their last pin is released.  The object driver bumps with
    ``sweep=False``: the spec's bump_version changes the version only."""
    phases = [SimpleNamespace(ph=r.phase) for r in self.reqs.values()]
    if self.object_driver is not None:
        phases += self.object_driver.state.req
    view = SimpleNamespace(miv=self.miv, req=phases)
    if not can_bump_version(view, SimpleNamespace(max_iv=self.max_iv)):
        raise Refused("indexer version bump needs a quiescent cache", self.miv)
    self.miv += 1
    for cx in self.ctx.values():
        cx.miv = self.miv
    if sweep:
        sweep_stale(self)


def sweep_stale(self):
    """Return every outdated indexer block to the free list through the tables: READY ones
    now; pinned (or still in transit) ones are watched and swept when they land READY."""
    for (kind, g), pool in self.pools.items():
        if kind != "idx":
            continue
        pool.on_ready = functools.partial(_sweep_block, self, kind, g)
        for b, rec in enumerate(pool.recs):          # once per bump: a full pass is fine
            if rec.st != FREE and rec.iv != self.miv:
                if rec.st in (READY, STALE):
                    _sweep_block(self, kind, g, b)
                else:
                    pool.watch.add(b)


def _sweep_block(self, kind, g, b):
    pool = self.pools[(kind, g)]
    rec = pool.recs[b]
    if rec.iv == self.miv:
        return
    if rec.st == READY and pool.target(b, "mark_stale") is not None:
        pool.fire(b, "mark_stale")
    if pool.recs[b].st == STALE and pool.target(b, "drop_stale") is not None:
        A.drop(self, ObjRef(kind, g, b), "drop_stale")


@locked
def stats(self):
    pools = {}
    for (kind, g), p in self.pools.items():
        counts = {name: 0 for name in _ST.values()}
        for r in p.recs:
            counts[_ST[r.st]] += 1
        counts.update(blocks=p.n, evictable=len(self.evictable[(kind, g)]),
                      block_bytes=p.block_nbytes)
        pools[f"{kind}/{g}"] = counts
    out = {"pools": pools, "requests": len(self.reqs), "checkpoints": len(self.index.ckpts),
           "in_transit": sum(p.n_writing for p in self.pools.values()) + self.disk_transit(),
           "cap": self.cap, "indexer_version": self.miv, "granule": self.layout.granule,
           **self.metrics.summary()}
    link = self.disk_link
    if link is not None:
        out["disk"] = dict(link.counts, loads_in_flight=len(link.loads),
                           loads_queued=len(link.pending),
                           used_bytes=link.tier.used_bytes, entries=len(link.tier.keys()))
    return out


def metrics_text(self):
    return self.metrics.prometheus_text()


def check_invariants(self):
    """Assert every spec invariant on the whole runtime state (see hybridkv.checked);
    raises InvariantViolation naming the first that fails."""
    with self.lock:
        check_all(self)


def _link(self):
    if self.disk_link is None:
        raise BadArgument("this cache has no disk tier", None)
    return self.disk_link


@locked
def prefetch(self, plan_or_request_id):
    """Start verified loads of the disk objects a HitPlan reports (``plan.disk``) into
    preallocated FREE blocks (LOADING until verified), queueing what the admission cap or
    the tier's in-flight budget does not admit yet; returns how many were accepted.  Takes a
    HitPlan or a looked-up request id.  Disk faults are not raised: such a load ends as a
    miss.  A later lookup reuses the objects once verified (see wait_loads)."""
    from hybridkv.lookup import HitPlan
    link = _link(self)
    plan = plan_or_request_id if isinstance(plan_or_request_id, HitPlan) \
        else self._req(plan_or_request_id).plan
    if not plan.disk:
        return 0
    return link.start(plan.disk, plan.disk_ckpt, [r.ref for r in plan.reads])


@locked
def wait_loads(self, timeout=10.0):
    """Wait (up to ``timeout`` s in all) for loads in flight and queued, publish the
    verified ones; returns how many are still in flight or queued."""
    link = _link(self)
    link.reap(wait=timeout)
    return len(link.loads) + len(link.pending)


@locked
def cancel_loads(self):
    """Cancel loads in flight (their blocks go back FREE untouched); returns how many
    are still finishing (already copied: published on the next reap)."""
    link = _link(self)
    link.cancel()
    return len(link.loads)


@locked
def spill_all(self):
    """Spill every READY published object to the disk tier (memory copies stay), e.g.
    before shutdown; returns how many were written."""
    return _link(self).spill_all()


@property
def objects(self):
    """The object-level driver (spec actions on single objects), see hybridkv.driver."""
    if self.object_driver is None:
        from hybridkv.driver import ObjectDriver
        self.object_driver = ObjectDriver(self)
    return self.object_driver
