"""CacheManager methods: free, release of pins, indexer version bumps, stats, invariants."""
from types import SimpleNamespace

from hybridkv import alloc as A
from hybridkv.checked import check_all
from hybridkv.errors import Refused
from hybridkv.locking import locked
from spec.common import FREE, LOADING, PINNED, READY, STALE, WRITING
from spec.system import can_bump_version

_ST = {FREE: "free", WRITING: "writing", READY: "ready", PINNED: "pinned", LOADING: "loading",
       STALE: "stale"}


def _release_reads(self, req):
    for r in req.reads:
        pk = (r.ref.kind, r.ref.group)
        rec = self.pools[pk].fire(r.ref.block, "unpin")
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
def bump_indexer_version(self):
    """New indexer weights: only at a quiescent point (spec can_bump_version); objects of
    the old version stop covering any H (spec indexer.covers) and age out."""
    phases = [SimpleNamespace(ph=r.phase) for r in self.reqs.values()]
    if self.object_driver is not None:
        phases += self.object_driver.state.req
    view = SimpleNamespace(miv=self.miv, req=phases)
    if not can_bump_version(view, SimpleNamespace(max_iv=self.max_iv)):
        raise Refused("indexer version bump needs a quiescent cache", self.miv)
    self.miv += 1
    for cx in self.ctx.values():
        cx.miv = self.miv


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
    return {"pools": pools, "requests": len(self.reqs), "checkpoints": len(self.index.ckpts),
            "in_transit": sum(p.n_writing for p in self.pools.values()), "cap": self.cap,
            "indexer_version": self.miv, "granule": self.layout.granule,
            **self.metrics.summary()}


def metrics_text(self):
    return self.metrics.prometheus_text()


def check_invariants(self):
    """Assert the spec invariants on the runtime state (see hybridkv.checked); raises
    InvariantViolation naming the first that fails."""
    with self.lock:
        check_all(self)


@property
def objects(self):
    """The object-level driver (spec actions on single objects), see hybridkv.driver."""
    if self.object_driver is None:
        from hybridkv.driver import ObjectDriver
        self.object_driver = ObjectDriver(self)
    return self.object_driver
