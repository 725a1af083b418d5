"""Object-level driver (a test harness): the spec's actions (spec.ACTIONS) applied to single
runtime objects.

For the conformance test on a small configuration: ``CacheManager.for_spec(cfg)`` builds one
CSA group with an indexer whose four pools hold ``cfg.n_obj`` blocks each (abstract object i
of kind k = block i of that kind's pool); ``ObjectDriver(mgr)`` registers itself with the
manager as a pin holder.  Each action runs the runtime's own primitives -- Pool.fire
(compiled tables + spec guards/effects), Pool.relocate (real data move),
hybridkv.cache.funnel.object_ready (the lookup's readiness checks), CacheManager.read_ok (the
launch re-check), the admission rule -- and raises ``Refused`` (changing nothing) where the
spec says the action is disabled.  ``abstract()`` maps the runtime to spec.state.Sys;
``restore(sys)`` loads one (a trace's arbitrary start state).

Where the runtime evaluates a spec.system guard with its own code instead of calling it (the
funnel, the launch re-check, load admission), it does so conjunct by conjunct through the
named checks below (ADMIT_CHECKS, LOOKUP_CHECKS, LAUNCH_CHECKS; driver_disk.LOAD_START_CHECKS;
the funnel's readiness conjuncts are hybridkv.cache.funnel.READY_CHECKS), so a test can drop the
runtime's counterpart of one spec conjunct (tests/cache/test_golden.py mirrors the spec's guard
mutants this way).
"""
from dataclasses import dataclass, field

from hybridkv.cache.funnel import KIND_MODULE, Read, object_ready
from hybridkv.cache.pool import ObjRef
from hybridkv.cache.tables import TransitionRefused
from hybridkv.errors import Refused
from spec.common import PINNED
from spec.disk import DiskRec
from spec import system as S
from spec.funnel import can_hit_aligned, can_hit_groups
from spec.state import (HELD, IDLE, KINDS, LOOKED, RUNNING, D_LOADING, D_WRITING, Graph, Req,
                        Sys)
from spec.common import FREE

IDX = KINDS.index("idx")



# spec.system.can_lookup minus the funnel's readiness conjuncts (lookup.READY_CHECKS)
def _aligned(d, r, ref, H):
    """The granule and, per kind, its block boundary or a checkpoint taken at exactly H."""
    blocks = getattr(d.cfg, "blocks", ())
    if not blocks:
        return can_hit_aligned(H, d.cfg.granule, (), ())
    exact = [KIND_MODULE[KINDS[k]].checkpoint(p.recs[i]) == H
             for k, (p, i) in enumerate(zip(d.pools, ref))][:len(blocks)]
    return can_hit_aligned(H, d.cfg.granule, blocks, exact)


LOOKUP_CHECKS = {"phase": lambda d, r, ref, H: d.state.req[r].ph == IDLE, "aligned": _aligned}
# spec.system.can_launch: the phase, then the runtime's TOCTOU re-check (CacheManager.read_ok)
# spec.system.can_admit: the runtime's admission rule (Admission.admits: funnel.can_admit_objects)
ADMIT_CHECKS = {"admit": lambda d: d.mgr.admission.admits(1)}
LAUNCH_CHECKS = {"phase": lambda d, r: d.state.req[r].ph == HELD,
                 "read_ok": lambda d, r: all(d.mgr.read_ok(x) for x in d.reads(r))}


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
        mgr.holders.append(self)

    # -- views -----------------------------------------------------------------------------
    def abstract(self):
        s = self.state
        return Sys(mem=tuple(tuple(p.recs) for p in self.pools), disk=tuple(s.disk),
                   req=tuple(s.req), graph=tuple(s.graph), miv=self.mgr.miv)

    # -- what the manager asks of a holder ------------------------------------------------
    def disk_transit(self):
        return sum(d.st in (D_WRITING, D_LOADING) for d in self.state.disk)

    def requests_in_flight(self):
        return sum(r.ph != IDLE for r in self.state.req)

    def indexer_loads(self):
        return sum(d.st == D_LOADING and d.kind == IDX for d in self.state.disk)

    def owned(self):
        """Every non-free block of its pools: the driver writes and holds them directly."""
        return [(KINDS[k], self.group, i) for k, p in enumerate(self.pools)
                for i, r in enumerate(p.recs) if r.st != FREE]

    def abstract_state(self):
        return self.abstract(), self.cfg

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
        """Run spec action ``name``; raises Refused (having changed nothing) when disabled."""
        with self.mgr.lock:
            try:
                getattr(self, name)(*args)
            except TransitionRefused as e:     # the table refused (not checked up front)
                raise Refused("transition refused", (name, args, str(e))) from e

    def restore(self, sys_state):
        """Load an abstract state (spec.state.Sys): records into the pools (free lists and
        counters rebuilt), requests, graphs, disk records and the indexer version."""
        for p, recs in zip(self.pools, sys_state.mem):
            p.load_records(list(recs))
        self.state = DriverState(list(sys_state.req), list(sys_state.graph),
                                 list(sys_state.disk))
        self.mgr.miv = sys_state.miv
        for cx in self.mgr.ctx.values():
            cx.miv = sys_state.miv

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
    def admits(self):
        return all(fn(self) for fn in ADMIT_CHECKS.values())

    def write(self, k, i, p, draft=0):
        self._need(self.admits(), "admission")
        self._can(k, i, "draft" if draft else "write")
        self.pools[k].write(i, p, draft)

    def draft(self, k, i, p):
        self.write(k, i, p, 1)

    def fill(self, k, i):
        self._fire(k, i, "fill")

    def accept(self, k, i):
        self._fire(k, i, "accept")

    def publish(self, k, i):
        self._fire(k, i, "publish")

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
        self.mgr.bump_indexer_version(sweep=False)    # the spec's bump_version sweeps nothing

    # -- requests ------------------------------------------------------------------------------
    def _set_req(self, r, **kw):
        self.state.req[r] = self.state.req[r]._replace(**kw)

    def _checks(self, checks, *args):
        for name, fn in checks.items():
            self._need(fn(self, *args), (name, args))

    def lookup(self, r, ref, H):
        cx = self.mgr.ctx[self.group]
        # phase and alignment here; the funnel below is the runtime's own (object_ready)
        self._checks(LOOKUP_CHECKS, r, ref, H)
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

    def reads(self, r):
        """The request's pinned objects as the runtime's Read records."""
        q = self.state.req[r]
        return [Read(ObjRef(KINDS[k], self.group, i), q.H, q.pv[k], q.pe[k])
                for k, i in enumerate(q.ref)]

    def launch(self, r):
        self._checks(LAUNCH_CHECKS, r)
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
        return tuple(p.recs.value(i, "ep") for p, i in zip(self.pools, ref))

    def capture(self, g, r):
        q = self.state.req[r]
        self._need(S.can_capture(self.abstract(), self.cfg, g, r),
                   ("capture needs a running request", r))
        # history: did the graph bake in an address its request had not pinned and validated?
        sound = all(o.st == PINNED and o.ver == q.pv[k] and o.ep == q.pe[k]
                    for k, o in enumerate(p.recs[i] for p, i in zip(self.pools, q.ref)))
        bad = self.state.graph[g].bad if sound else 1
        self.state.graph[g] = Graph(1, q.ref, self._eps(q.ref), bad)

    def replay(self, g):
        self._need(S.can_replay_graph(self.abstract(), self.cfg, g), ("replay", g))
        gr = self.state.graph[g]                # history: a replay over moved addresses
        if not (gr.cap == 1 and tuple(gr.eps) == self._eps(gr.ref)):
            self.state.graph[g] = gr._replace(bad=1)

    def release_graph(self, g):
        z = (0,) * len(KINDS)                    # a released graph forgets its addresses
        self.state.graph[g] = self.state.graph[g]._replace(cap=0, ref=z, eps=z)

    from hybridkv.testing.driver_disk import (damage, drop, load_bad, load_cancel,  # noqa: E402
                                      load_ok, load_start, spill_crash, spill_done,
                                      spill_start)
