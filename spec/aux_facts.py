"""Auxiliary invariants: facts about the system that make the invariants of
``spec.invariants`` inductive (k-induction proves the strengthening INVARIANTS + AUX).

Each is itself proven, never assumed: it is part of the strengthening whose every conjunct
must be inductive.  ``ranges`` is the model's typing fact (every leaf inside its domain);
the others say what the system keeps true between the states the invariants talk about.
"""
from spec.common import FREE, LOADING, PINNED, WRITING, readable
from spec.config import Ctx
from spec.dual import And, Implies, Mod, Or, Select
from spec.invariants import _complete, _sound_at, intact
from spec.state import (D_FREE, D_LOADING, D_WRITING, DISK, IDLE, KINDS, MACHINES, RECS,
                        RUNNING, refs_of)

IDX, SWA = KINDS.index("idx"), KINDS.index("swa")


def _within(x, lo, hi):
    return And(x >= lo, x <= hi)


def _one_of(x, vals):
    return Or(*[x == v for v in sorted(vals)])


def value_ranges(s, c):
    """Every value leaf lies in its type's range (state values of its machine, positions
    <= max_pos, counters <= their caps, fault marks 0/1): ``ranges`` without its bounds that
    depend on the sizes (indices < sizes, pins <= holders), so it holds at every size."""
    facts = [_within(s.miv, 0, c.max_iv)]
    for k, objs in enumerate(s.mem):
        sts = {st.value for st in MACHINES[k].states}
        for o in objs:
            facts += [_one_of(o.st, sts), _within(o.ver, 0, c.max_ver), o.pins >= 0,
                      _within(o.ep, 0, c.max_ep), _within(o.draft, 0, 1), _within(o.pub, 0, 1)]
            facts += [_within(getattr(o, f), 0, c.max_pos) for f in o.CONTENT]
    for d in s.disk:
        facts += [_one_of(d.st, {st.value for st in DISK.states}),
                  _within(d.kind, 0, len(KINDS) - 1), _within(d.tk, 0, len(KINDS) - 1),
                  _within(d.ver, 0, c.max_ver), _within(d.hdr, 0, 1), _within(d.ck, 0, 1),
                  _within(d.off, 0, 1), _within(d.ln, 0, 1), _within(d.abi, c.kabi, c.kabi + 1)]
        facts += [_within(v, 0, c.max_pos) for v in (d.a, d.b, d.x)]
    for r in s.req:
        facts += [_within(r.ph, 0, RUNNING), _within(r.H, 0, c.max_pos)]
        facts += [_within(x, 0, c.max_ver) for x in r.pv]
        facts += [_within(x, 0, c.max_ep) for x in r.pe]
    for g in s.graph:
        facts += [_within(g.cap, 0, 1), _within(g.bad, 0, 1)]
        facts += [_within(x, 0, c.max_ep) for x in g.eps]
    return And(*facts)


def ranges(s, c):
    """Every leaf lies in its type's range: ``value_ranges``, plus indices < sizes and pins
    at most the possible holders (requests and disk slots)."""
    n_holders = c.n_req + c.n_disk
    facts = [value_ranges(s, c)]
    facts += [o.pins <= n_holders for objs in s.mem for o in objs]
    facts += [_within(d.obj, 0, c.n_obj - 1) for d in s.disk]
    facts += [_within(x, 0, c.n_obj - 1) for r in s.req for x in r.ref]
    facts += [_within(x, 0, c.n_obj - 1) for g in s.graph for x in g.ref]
    return And(*facts)


def refs_current(s, c):
    """A request past lookup: its H is a valid resume point; versions and epochs only grow
    since lookup; an object that still has the version lookup saw was never retired (so it
    is not free, writing or loading) and, while readable, still holds what resuming at H
    needs: content changes only after a retirement, which mints a new version."""
    facts = []
    for r in s.req:
        busy = r.ph != IDLE
        facts += [Implies(busy, And(r.H >= 1, Mod(r.H, c.granule) == 0))]
        for k, o in enumerate(refs_of(s, r.ref)):
            same = And(busy, o.ver == r.pv[k])
            facts += [Implies(busy, And(o.ver >= r.pv[k], o.ep >= r.pe[k])),
                      Implies(same, And(o.st != FREE, o.st != WRITING, o.st != LOADING)),
                      Implies(And(same, readable(o.st)), _need(k, o, r.H, s, c))]
    return And(*facts)


def _need(k, o, H, s, c):
    """``_sound_at`` with the pinned-state conjunct discharged (a request that has only
    looked up holds no pin yet)."""
    return _sound_at(k, o._replace(st=PINNED), H, s, c)


def copies_complete(s, c):
    """A disk copy that would pass the load checks holds the complete content of a
    published object of its kind (so a verified load publishes a complete object); an
    indexer copy never comes from a future indexer version; a loading copy's target block is
    loading; a copy being written comes from a block of its own kind."""
    cx = Ctx(c, s.miv)
    facts = []
    for d in s.disk:
        live = d.st != D_FREE
        facts += [Implies(And(live, d.kind == IDX), d.x <= s.miv)]
        for k, R in enumerate(RECS):
            rec = R()._replace(**dict(zip(R.CONTENT, (d.a, d.b, d.x))))
            facts += [Implies(And(live, intact(d, c), d.kind == k), _complete(k, rec, cx)),
                      Implies(And(d.st == D_LOADING, d.tk == k),
                              Select(s.mem[k], d.obj).st == LOADING),
                      Implies(And(d.st == D_WRITING, d.tk == k), d.kind == k)]
    return And(*facts)


def swa_interval(s, c):
    """An SWA window is an interval in every state, not only once published (write opens
    it empty at p, fill and slide keep lo <= hi), so sealing never publishes lo > hi."""
    return And(*[_complete(SWA, o, c) for o in s.mem[SWA]])


AUX = {"swa_interval": swa_interval, "ranges": ranges, "refs_current": refs_current,
       "copies_complete": copies_complete}
# the parametric tier's strengthening: sizes are unbounded, so its typing fact is the
# size-free ``value_ranges`` (indices are elements of a sort there, never out of range)
PARAMETRIC_AUX = {**{n: p for n, p in AUX.items() if n != "ranges"},
                  "value_ranges": value_ranges}
