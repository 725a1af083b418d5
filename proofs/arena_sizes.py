"""State routing over the block arena for every number of pages and of blocks per pool at
once (the pools themselves: ``spec.arena_system.ArenaConfig.pools``).

The parametric tier's method (``proofs.parametric``) on the arena system: pages and blocks
are elements of uninterpreted sorts ``Page`` and ``Blk``, every record field an array over its
sort (``proofs.pstate.PSeq``; a page's owner block is a ``Blk`` element), so
``spec.arena_system.step`` builds each transition with the spec's own guards.  The facts
(``arena_routing``, ``arena_accounting``) are closed with ``ForAll`` per element; the pages a
block owns and the pages / blocks counted by accounting are cardinality terms
(``proofs.pstate.Scope.count``), constrained only by what is true of every finite set.  A fact
is ``proven-all-sizes`` when it holds initially at every size and ``S and T`` imply it after
every action (one query per action, E-matching first, MBQI second); else ``bounded-only``
with the reason.  ``page_count`` is a statement about one size and is not stated here.
"""
import time

import z3

from spec import dual
from spec.arena import GUARDS, NO_KIND, PAGE_FREE, PageRec
from spec.arena_system import (PARAMS, Block, ArenaSys, action, arena_accounting, arena_routing,
                               moves, step)
from spec.common import FREE

from proofs.arena import CONFIG, guard_mutants
from proofs.mutate import applied
from proofs.parametric import FactResult, check
from proofs.pstate import PSeq, Scope

PAGE, BLK = z3.DeclareSort("Page"), z3.DeclareSort("Blk")
NO_BLOCK = z3.Const("blk0", BLK)   # the owner block of a page nobody ever owned
FACTS = {f.__name__: f for f in (arena_routing, arena_accounting)}


class ArenaScope(Scope):
    """``proofs.pstate.Scope`` over the arena's state: pages over ``Page``, each pool's
    blocks over ``Blk``."""

    def state(self, frame):
        arrays = {}
        seqs = [(("pages",), PAGE, PageRec(), {"block": BLK})]
        seqs += [(("blocks", j), BLK, Block(), {}) for j in range(len(self.c.pools))]
        out = []
        for key, sort, rec, ranges in seqs:
            arr = {}
            for f in rec._fields:
                rng = ranges.get(f, z3.IntSort())
                name = "!".join(map(str, key + (f,)))
                arr[(f,)] = z3.Array(f"{frame}!{name}", sort, rng)
                self.paths[key + (f,)] = z3.Array(f"S!{name}", sort, rng)
                arrays[key + (f,)] = arr[(f,)]
            out.append(PSeq(self, key[0], sort, rec, arr))
        self.frame_arrays[frame] = arrays
        for a in arrays.values():
            self.frames[a.get_id()] = frame
        return ArenaSys(pages=out[0], blocks=tuple(out[1:]))

    def initial_values(self, frame):
        start = {("st",): PAGE_FREE, ("kind",): NO_KIND, ("group",): 0, ("block",): NO_BLOCK}
        out = []
        for path, a in self.frame_arrays[frame].items():
            v = start[path[-1:]] if path[0] == "pages" else FREE
            out.append(a == z3.K(a.sort().domain(), v if z3.is_expr(v) else z3.IntVal(v)))
        return out


def _bool(x):
    return z3.BoolVal(x) if isinstance(x, bool) else x


def _arrays(s):
    out = {("pages",) + p: a for p, a in s.pages.arrays.items()}
    for j, blocks in enumerate(s.blocks):
        out.update({("blocks", j) + p: a for p, a in blocks.arrays.items()})
    return out


class ArenaAllSizes:
    """Frames P (before a step), Q (after) and I (initial) of the arena system, one step per
    (pool, event) with its block and pages left as free elements."""

    def __init__(self, c=CONFIG):
        self.c, self.scope = c, ArenaScope(c)
        dual.set_width(None)
        dual.set_counter(self.scope.count)
        try:
            self._build(c, self.scope)
        finally:
            dual.set_counter(None)

    def _build(self, c, sc):
        pre, post, init = sc.state("P"), sc.state("Q"), sc.state("I")
        args = {"b": z3.Const("a!b", BLK), "p": z3.Const("a!p", PAGE),
                "q": z3.Const("a!q", PAGE)}
        self.steps = []      # (label, enabled, arrays after, element points stored at)
        for j, (kind, _) in enumerate(c.pools):
            for event in sorted(moves(kind)):
                sc.points = []
                params = PARAMS[action(kind, event)]
                en, s2 = step(pre, c, event, (j, *[args[a] for a in params]))
                self.steps.append((f"{event}@{j}", _bool(en), _arrays(s2), list(sc.points)))
        self.facts = {frame: {n: sc.fact(lambda f=f, s=s: f(s, c)) for n, f in FACTS.items()}
                      for frame, s in (("P", pre), ("Q", post), ("I", init))}
        self.axioms = {f: sc.card_axioms(f) for f in ("P", "Q", "I")}
        self.deltas = [sc.deltas(arrays, points) for _, _, arrays, points in self.steps]
        self.initial = sc.initial_values("I")

    def base(self, name, timeout_ms):
        return check(self.initial + self.axioms["I"] + [z3.Not(self.facts["I"][name])],
                     timeout_ms)

    def step_query(self, name, a):
        """Unsat iff: every fact before, action ``a``, and ``name`` false after."""
        sc, (_, en, arrays, _) = self.scope, self.steps[a]
        new = sc.frame_arrays["Q"]
        sub = [(new[p], arrays[p]) for p in new]
        moved, cards = self.deltas[a], list(sc.cards.values())
        same = [(k.func("Q"), k.func("P")(*[z3.Var(i, o.sort()) for i, o in enumerate(k.outer)]))
                for k in cards if k.n not in moved]
        post = z3.substitute(self.facts["Q"][name], *sub)
        post = z3.substitute_funs(post, *same) if same else post
        ax = [z3.substitute(f, *sub) for k, f in zip(cards, self.axioms["Q"]) if k.n in moved]
        upd = [f for k, f in zip(cards, sc.update_axioms(moved)) if k.n in moved]
        return list(self.facts["P"].values()) + self.axioms["P"] + ax + upd + [en, z3.Not(post)]

    def induction(self, name, timeout_ms):
        """(verdict, label of the first action whose step query is not unsat)."""
        for a, (label, *_) in enumerate(self.steps):
            q = self.step_query(name, a)
            r = check(q, 5_000, mbqi=False)
            r = r if r == z3.unsat else check(q, timeout_ms)
            if r != z3.unsat:
                return r, label
        return z3.unsat, None


def prove_all_sizes(c=CONFIG, timeout_ms=60_000, stop_at_first=False):
    """FactResult per fact (``proofs.parametric``'s rows), plus the build seconds."""
    t0 = time.perf_counter()
    enc = ArenaAllSizes(c)
    built, out = time.perf_counter() - t0, []
    for name in FACTS:
        t1 = time.perf_counter()
        b = enc.base(name, timeout_ms)
        r, label = enc.induction(name, timeout_ms) if b == z3.unsat else (b, "the initial state")
        detail = "" if r == z3.unsat else f"{'cti' if r == z3.sat else 'unknown'} at {label}"
        out.append(FactResult(name, "proven-all-sizes" if r == z3.unsat else "bounded-only",
                              time.perf_counter() - t1, detail))
        if stop_at_first and detail:
            break
    if any(f.result != "proven-all-sizes" for f in out):   # each query assumes every fact
        out = [f._replace(result="bounded-only", detail=f.detail or "another fact not proven")
               for f in out]
    return out, built


def mutate_all_sizes(c=CONFIG, timeout_ms=60_000, only=()):
    """Each arena guard mutant (``proofs.mutate``): ``killed`` when some fact is no longer
    proven for all sizes (a CTI, or Z3 giving up where the real guards are proven),
    ``redundant`` when both stay proven.  Dicts as ``proofs.parametric.mutate_parametric``'s."""
    out = []
    for m in guard_mutants(only):
        t0 = time.perf_counter()
        with applied(m, GUARDS):
            res, _ = prove_all_sizes(c, timeout_ms, stop_at_first=True)
        bad = [f for f in res if f.detail and f.detail != "another fact not proven"]
        out.append(dict(mutant=m.name, result="killed" if bad else "redundant",
                        fact=f"{bad[0].name} ({bad[0].result} {bad[0].detail})" if bad else "",
                        seconds=round(time.perf_counter() - t0, 1)))
    return out
