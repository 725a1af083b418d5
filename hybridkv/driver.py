"""Object-level driver: the spec's actions (spec.ACTIONS) applied to single runtime objects.

For the conformance test on a small configuration: ``CacheManager.for_spec(cfg)`` builds one
CSA group with an indexer whose four pools hold ``cfg.n_obj`` blocks each (abstract object i
of kind k = block i of that kind's pool).  Each action runs the runtime's own primitives --
Pool.fire (compiled tables + spec guards/effects), Pool.relocate (real data move),
hybridkv.lookup.object_ready (the lookup's readiness checks), CacheManager.read_ok (the
launch re-check), the admission check -- and raises ``Refused`` (changing nothing) where the
spec says the action is disabled.  ``abstract()`` maps the runtime to spec.state.Sys.
"""
from dataclasses import dataclass, field

from hybridkv import alloc as A
from hybridkv.errors import Refused
from hybridkv.lookup import object_ready
from hybridkv.tables import table_for
from spec.disk import DiskPrefixMachine, DiskRec
from spec import system as S
from spec.funnel import can_hit_aligned, can_hit_groups
from spec.state import (HELD, IDLE, KINDS, LOOKED, RUNNING, D_LOADING, D_WRITING, Graph, Req,
                        Sys)

_DISK = table_for(DiskPrefixMachine)


@dataclass
class DriverState:
    req: list
    graph: list
    disk: list = field(default_factory=list)


class ObjectDriver:
    def __init__(self, mgr, cfg=None):
        self.mgr, self.cfg = mgr, cfg or mgr.spec_cfg
        c, z = self.cfg, (0,) * len(KINDS)
        self.group = mgr.layout.groups[0].name
        self.pools = [mgr.pools[(k, self.group)] for k in KINDS]
        self.state = DriverState([Req(IDLE, 0, z, z, z) for _ in range(c.n_req)],
                                 [Graph(0, z, z, 0) for _ in range(c.n_graph)],
                                 [DiskRec(*(0,) * len(DiskRec._fields)) for _ in range(c.n_disk)])

    # -- views -----------------------------------------------------------------------------
    def abstract(self):
        s = self.state
        return Sys(mem=tuple(tuple(p.recs) for p in self.pools), disk=tuple(s.disk),
                   req=tuple(s.req), graph=tuple(s.graph), miv=self.mgr.miv)

    def disk_transit(self):
        return sum(d.st in (D_WRITING, D_LOADING) for d in self.state.disk)

    def holders(self):
        out = {}
        for r in self.state.req:
            if r.ph in (HELD, RUNNING):
                for k, i in enumerate(r.ref):
                    key = (KINDS[k], self.group, i)
                    out[key] = out.get(key, 0) + 1
        for d in self.state.disk:
            if d.st == D_WRITING:
                key = (KINDS[d.tk], self.group, d.obj)
                out[key] = out.get(key, 0) + 1
        return out

    def do(self, name, args):
        with self.mgr.lock:
            getattr(self, name)(*args)

    # -- helpers ---------------------------------------------------------------------------
    def _need(self, ok, what):
        if not ok:
            raise Refused("action disabled", what)

    def _can(self, k, i, event):
        self._need(self.pools[k].target(i, event) is not None, (KINDS[k], i, event))

    def _fire(self, k, i, event, *args):
        self._can(k, i, event)
        return self.pools[k].fire(i, event, *args)

    # -- memory objects ----------------------------------------------------------------------
    def write(self, k, i, p, draft=0):
        self._need(A.admits(self.mgr, 1), "admission")
        self._can(k, i, "draft" if draft else "write")
        self.pools[k].write(i, p, draft)

    def draft(self, k, i, p):
        self.write(k, i, p, 1)

    def fill(self, k, i):
        self._fire(k, i, "fill")

    def accept(self, k, i):
        self._fire(k, i, "accept")

    def reject(self, k, i):
        self._fire(k, i, "reject")

    def seal(self, k, i):
        self._fire(k, i, "seal")

    def evict(self, k, i):
        self._fire(k, i, "evict")

    def relocate(self, k, i):
        self._can(k, i, "relocate")
        self.pools[k].relocate(i)

    def slide(self, i):
        self._fire(KINDS.index("swa"), i, "slide")

    def mark_stale(self, i):
        self._fire(KINDS.index("idx"), i, "mark_stale")

    def drop_stale(self, i):
        self._fire(KINDS.index("idx"), i, "drop_stale")

    def bump_version(self):
        self.mgr.bump_indexer_version()

    # -- requests ------------------------------------------------------------------------------
    def _set_req(self, r, **kw):
        self.state.req[r] = self.state.req[r]._replace(**kw)

    def lookup(self, r, ref, H):
        cx = self.mgr.ctx[self.group]
        # the phase only: the funnel below is the runtime's own (object_ready), under test
        self._need(self.state.req[r].ph == IDLE, ("request busy", r))
        self._need(can_hit_aligned(H, self.cfg.granule, (), ()), ("aligned", H))
        recs = [p.recs[i] for p, i in zip(self.pools, ref)]
        flags = [object_ready(KINDS[k], o, H, cx)[0] for k, o in enumerate(recs)]
        self._need(can_hit_groups(flags), ("funnel", H))
        self._set_req(r, ph=LOOKED, H=H, ref=tuple(ref), pv=tuple(o.ver for o in recs),
                      pe=tuple(o.ep for o in recs))

    def _all(self, r, event):
        q = self.state.req[r]
        for k, i in enumerate(q.ref):
            self._can(k, i, event)
        for k, i in enumerate(q.ref):
            self.pools[k].fire(i, event)

    def pin(self, r):
        self._need(S.can_pin(self.abstract(), self.cfg, r), ("not looked", r))
        self._all(r, "pin")
        self._set_req(r, ph=HELD)

    def launch(self, r):
        from hybridkv.lookup import Read
        from hybridkv.pools import ObjRef
        q = self.state.req[r]
        self._need(q.ph == HELD, ("not held", r))   # the version/epoch re-check is read_ok's
        for k, i in enumerate(q.ref):
            read = Read(ObjRef(KINDS[k], self.group, i), q.H, q.pv[k], q.pe[k])
            self._need(self.mgr.read_ok(read), ("stale read", read))
        self._set_req(r, ph=RUNNING)

    def _idle(self, r):                      # an idle request forgets everything
        z = (0,) * len(KINDS)
        self.state.req[r] = Req(IDLE, 0, z, z, z)

    def release(self, r):
        self._need(S.can_release(self.abstract(), self.cfg, r), ("nothing held", r))
        self._all(r, "unpin")
        self._idle(r)

    def forget(self, r):
        self._need(S.can_forget(self.abstract(), self.cfg, r), ("not looked", r))
        self._idle(r)

    # -- graphs (I4) -----------------------------------------------------------------------------
    def _eps(self, ref):
        return tuple(p.recs[i].ep for p, i in zip(self.pools, ref))

    def capture(self, g, r):
        q = self.state.req[r]
        self._need(S.can_capture(self.abstract(), self.cfg, g, r), ("capture needs a running request", r))
        self.state.graph[g] = Graph(1, q.ref, self._eps(q.ref), self.state.graph[g].bad)

    def replay(self, g):
        self._need(S.can_replay_graph(self.abstract(), self.cfg, g), ("replay", g))

    def release_graph(self, g):
        z = (0,) * len(KINDS)                    # a released graph forgets its addresses
        self.state.graph[g] = self.state.graph[g]._replace(cap=0, ref=z, eps=z)

    from hybridkv.driver_disk import (damage, drop, load_bad, load_cancel, load_ok,  # noqa
                                      load_start, spill_crash, spill_done, spill_start)
