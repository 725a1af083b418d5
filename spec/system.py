"""The whole-system transition relation ``step(state, action) -> (enabled, next)``.

Pure and dual-mode: the BFS and the runtime's reference model call it on ints, the prover
on Z3 bit-vectors.  Memory objects change only through their machine tables (``fire``);
the ``can_<action>`` guards here add what spans objects: admission, the funnel, the
TOCTOU re-check, routing and topology.
"""
import itertools

from spec.effects import EFFECTS
from spec.common import readable
from spec.dual import And, Count, Implies, Or, Select, Store
from spec.funnel import (can_admit_objects, can_bump_indexer, can_hit_aligned, can_hit_groups,
                         can_read_pinned, can_replay)
from spec.state import (D_LOADING, DISK, HELD, IDLE, KIND_MODULES, KINDS, LOOKED, MACHINES,
                        RUNNING, ctx, inflight, refs_of)
from spec.table import fire

SWA, IDX = KINDS.index("swa"), KINDS.index("idx")
ACTIONS = {}   # name -> (function, domains(config) -> list of per-argument value lists)


def action(*domains):
    def register(fn):
        ACTIONS[fn.__name__] = (fn, lambda c: [d(c) for d in domains])
        return fn
    return register


K = lambda c: range(len(KINDS))          # noqa: E731  (argument domains)
O = lambda c: range(c.n_obj)             # noqa: E731
P = lambda c: range(1, c.max_pos + 1)    # noqa: E731
R = lambda c: range(c.n_req)             # noqa: E731
D = lambda c: range(c.n_disk)            # noqa: E731
G = lambda c: range(c.n_graph)           # noqa: E731
REFS = lambda c: list(itertools.product(range(c.n_obj), repeat=len(KINDS)))  # noqa: E731
FAULTS = lambda c: range(c.n_faults)      # noqa: E731


def _mem(s, c, k, i, event, *args):
    cx = ctx(s, c)
    o = Select(s.mem[k], i)
    en, st = fire(MACHINES[k], event, o.st, o, cx)
    new = EFFECTS[event](o, cx, *args)._replace(st=st)
    return en, s._replace(mem=Store(s.mem, k, Store(s.mem[k], i, new)))


def _disk(s, c, d, event, **fields):
    rec = Select(s.disk, d)
    en, st = fire(DISK, event, rec.st, rec, ctx(s, c))
    return en, s._replace(disk=Store(s.disk, d, rec._replace(st=st, **fields)))


def _req(s, r, **fields):
    return s._replace(req=Store(s.req, r, Select(s.req, r)._replace(**fields)))


def _all_refs(s, c, r, event):
    ens, s2 = [], s
    for k in range(len(KINDS)):
        en, s2 = _mem(s2, c, k, Select(s.req, r).ref[k], event)
        ens.append(en)
    return And(*ens), s2


# ---- system guards ----------------------------------------------------------------------
def can_admit(s, c):
    """I1: one more object in transit stays within the admission cap."""
    return can_admit_objects(inflight(s), 1, c.cap)


def can_bump_version(s, c):
    """The indexer is re-versioned only at a quiescent point (funnel.can_bump_indexer)."""
    return can_bump_indexer(s.miv, c.max_iv, Count(r.ph != IDLE for r in s.req),
                            Count(And(d.st == D_LOADING, d.kind == IDX) for d in s.disk))


def can_lookup(s, c, r, ref, H):
    """The funnel at one H: alignment (the granule, and per group its block boundary or an
    exact checkpoint at H), then every group ready at H (an intersection)."""
    cx = ctx(s, c)
    objs = refs_of(s, ref)
    comp, tl, sw, ix = objs
    m = KIND_MODULES
    exact = [mod.checkpoint(o) == H for mod, o in zip(m, objs)]   # partial block: a snapshot at H
    return And(Select(s.req, r).ph == IDLE,
               can_hit_aligned(H, c.granule, c.blocks, exact),
               can_hit_groups([readable(comp.st), m[0].covers(comp, H, cx),
                               readable(tl.st), m[1].covers(tl, H, cx),
                               readable(sw.st), m[2].covers(sw, H, cx),
                               readable(ix.st), m[3].covers(ix, H, cx)]))


def can_pin(s, c, r):
    return Select(s.req, r).ph == LOOKED


def can_launch(s, c, r):
    """TOCTOU: right before the launch, every pinned object is re-checked."""
    q = Select(s.req, r)
    return And(q.ph == HELD, *[can_read_pinned(o.pins, q.pv[k], o.ver, q.pe[k], o.ep)
                               for k, o in enumerate(refs_of(s, q.ref))])


def can_release(s, c, r):
    return Or(Select(s.req, r).ph == HELD, Select(s.req, r).ph == RUNNING)


def can_forget(s, c, r):
    return Select(s.req, r).ph == LOOKED


def can_load_start(s, c, d, k):
    """I2: a copy loads only into a block of its own kind; I1: admission; an indexer copy
    only while it is of the model's current indexer version."""
    rec = Select(s.disk, d)
    return And(rec.kind == k, can_admit(s, c), Implies(rec.kind == IDX, rec.x == s.miv))


def can_disk_target(s, c, d, k):
    return Select(s.disk, d).tk == k


def can_capture(s, c, g, r):
    return Select(s.req, r).ph == RUNNING


def can_replay_graph(s, c, g):
    """I4: replay only a captured graph whose every captured address is unchanged."""
    gr = Select(s.graph, g)
    return And(gr.cap == 1, can_replay(gr.eps, _eps_now(s, gr.ref)))


def _eps_now(s, ref):
    return tuple(o.ep for o in refs_of(s, ref))


# ---- actions on one memory object ------------------------------------------------------
@action(K, O, P)
def write(s, c, k, i, p):
    en, s2 = _mem(s, c, k, i, "write", p)
    return And(en, can_admit(s, c)), s2


@action(K, O, P)
def draft(s, c, k, i, p):
    en, s2 = _mem(s, c, k, i, "draft", p, 1)
    return And(en, can_admit(s, c)), s2


def _object_action(event):
    def act(s, c, k, i):
        return _mem(s, c, k, i, event)
    act.__name__ = event
    return action(K, O)(act)


fill = _object_action("fill")
accept = _object_action("accept")
publish = _object_action("publish")
reject = _object_action("reject")
seal = _object_action("seal")
relocate = _object_action("relocate")
evict = _object_action("evict")


@action(O)
def slide(s, c, i):
    return _mem(s, c, SWA, i, "slide")


@action(O)
def mark_stale(s, c, i):
    return _mem(s, c, IDX, i, "mark_stale")


@action(O)
def drop_stale(s, c, i):
    return _mem(s, c, IDX, i, "drop_stale")


@action()
def bump_version(s, c):
    return can_bump_version(s, c), s._replace(miv=s.miv + 1)
