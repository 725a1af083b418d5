"""Evidence for a parametric step that is not proven: a finite counterexample to induction
(CTI) of a known size, replayed on plain ints, and a reachable trace at that size.

``find_cti`` bounds every sort to 1, 2, ... elements (``proofs.finite``) until the step query
has a model: a state of that size satisfying the whole strengthening S in which the action
is enabled and breaks the fact.  The model is read back as a ``spec`` state and replayed
through ``spec.step`` (S checked on it concretely too): a CTI that does not replay raises
``FiniteMismatch``.  A CTI shows the induction step fails; ``reach`` then asks whether the
fact really breaks at that size, by the concrete bounded search of ``proofs.search`` (one
satisfiable query at a fixed depth from the initial state, its model replayed).
"""
import itertools
import time
from typing import NamedTuple

import z3

from spec.invariants import INVARIANTS
from spec.step import actions, step

from proofs import search
from proofs import trace as tr
from proofs.encode import Encoding
from proofs.finite import FiniteMismatch, Universe, concrete_state
from proofs.flat import flatten, leaf_paths
from proofs.pstate import OBJ

SHRINK_ORDER = ("n_graph", "n_obj", "n_disk", "n_req")   # the sorts a CTI loses elements of


class Cti(NamedTuple):
    fact: str          # the fact broken after the step
    action: str        # the action instance's name
    k: int             # every sort was bounded to at most k elements
    sizes: dict        # the CTI's own sizes: n_obj, n_req, n_disk, n_graph
    seconds: float     # finite search, all bounds tried
    trace: dict        # proofs.trace dict, kind "cti": start = the pre-state, one step

    def as_json(self):
        return {"fact": self.fact, "action": self.action, "k": self.k, "sizes": self.sizes,
                "seconds": round(self.seconds, 3), "trace": self.trace}


def finite_query(enc, names, a, uni):
    """Quantifier-free formulas whose models are the CTIs of instance ``a`` within ``uni``:
    S before, the step enabled, some fact of ``names`` false after; None when the step
    writes nothing those facts read."""
    qs = [q for q in (enc.step_parts(n, a) for n in names) if q is not None]
    if not qs:
        return None
    q, sc = qs[0], enc.scope
    fs = q.facts + q.dom + [q.enabled, z3.Or(*[x.goal for x in qs])]
    fs += uni.counts(sc, "P", sc.frame_arrays["P"]) + uni.counts(sc, "Q", enc.steps[a][1])
    memo = {}
    fs = [uni.expand(f, memo) for f in fs]
    return fs + uni.closure(fs) + uni.references(sc.frame_arrays["P"])


def _args(enc, ins, model, uni):
    """Concrete arguments of instance ``ins`` in ``model``."""
    out = []
    for a in ins.args:
        if not isinstance(a, str):
            out.append(a)
            continue
        v = enc.args[a]
        if isinstance(v, tuple):
            out.append(tuple(uni.index(model, OBJ, x) for x in v))
        elif v.sort() == z3.IntSort():
            out.append(model.eval(v, model_completion=True).as_long())
        else:
            out.append(uni.index(model, v.sort(), v))
    return tuple(out)


def cti_trace(c, s, name, args, fact, props, mutant=None):
    """The one-step trace of ``name(args)`` from state ``s``, checked on plain ints: S holds
    in ``s``, the step is enabled, ``fact`` is false after it."""
    bad = [n for n, p in props.items() if not p(s, c)]
    if bad:
        raise FiniteMismatch("the CTI's pre-state breaks S on plain ints", bad)
    en, s2 = step(s, c, name, args)
    changes = {p: [x, y] for p, x, y in zip(leaf_paths(s), flatten(s), flatten(s2)) if x != y}
    t = {"config": c._asdict(), "mutant": mutant, "kind": "cti", "invariant": fact,
         "start": dict(zip(leaf_paths(s), flatten(s))),
         "steps": [{"action": name, "args": [list(x) if isinstance(x, tuple) else x
                                              for x in args], "changes": changes}],
         "violated_at": 1, "aux": None}
    if not (en and tr.replay(t, props).reproduced):
        raise FiniteMismatch("the CTI does not replay through spec.step", (name, args, fact))
    return t


def _solve(enc, names, a, uni, deadline):
    """(sat/unsat/unknown, model) of the finite query (unsat when the step cannot change
    the facts)."""
    fs = finite_query(enc, names, a, uni)
    if fs is None:
        return z3.unsat, None
    sol = z3.Solver()
    sol.set("timeout", max(1, int((deadline - time.perf_counter()) * 1000)))
    sol.add(*fs)
    r = sol.check()
    return r, (sol.model() if r == z3.sat else None)


def find_cti(enc, names, a, props, kmax=3, timeout_ms=60_000, mutant=None):
    """A small CTI of instance ``a`` for the facts ``names``: the first bound k = 1, 2, ...
    ``kmax`` (every sort at most k elements) with one, then each sort shrunk while a CTI
    remains (so no sort can lose an element with the others fixed).  None: no CTI within
    ``kmax`` per sort, or Z3 gave up (``timeout_ms`` for the whole search)."""
    t0 = time.perf_counter()
    deadline = t0 + timeout_ms / 1000
    found = None
    for k in range(1, kmax + 1):
        uni = Universe(k)
        r, m = _solve(enc, names, a, uni, deadline)
        if r == z3.unknown:
            return None
        if r == z3.sat:
            found = (k, uni, m)
            break
    if found is None:
        return None
    k, uni, m = found
    sizes = uni.sizes(m)
    for field in SHRINK_ORDER:
        while sizes[field] > 1:
            smaller = Universe({**sizes, field: sizes[field] - 1})
            r, m2 = _solve(enc, names, a, smaller, deadline)
            if r != z3.sat:
                break
            uni, m, sizes = smaller, m2, smaller.sizes(m2)
    c2, s = concrete_state(enc.c, enc.scope.frame_arrays["P"], m, uni)
    ins = enc.inst[a]
    args = _args(enc, ins, m, uni)
    s2 = step(s, c2, ins.name, args)[1]
    broken = [n for n in names if not props[n](s2, c2)]
    if not broken:
        raise FiniteMismatch("no fact breaks on plain ints after the CTI's step", ins.name)
    t = cti_trace(c2, s, ins.name, args, broken[0], props, mutant)
    return Cti(broken[0], ins.name, k, sizes, time.perf_counter() - t0, t)


def reach(cti, depth, prefixes=(), timeout_ms=0, props=None):
    """A trace from the initial state, at the CTI's sizes, that breaks the CTI's fact, by
    the concrete bounded search of ``proofs.search``: every state along the action lists
    ``prefixes`` (known traces, e.g. ``tests/golden``; cut at their first action outside
    this configuration) seeds one satisfiable query of ``depth`` steps with stutter (from
    the initial state when there are none).  The trace is replayed and minimised.
    Returns (trace or None, the solver's answer, seconds)."""
    t0 = time.perf_counter()
    props = props or INVARIANTS
    c = tr.config_of(cti.trace)
    goal = {cti.fact: props[cti.fact]}
    mutant = cti.trace.get("mutant")
    legal = set(actions(c))
    cut = [list(itertools.takewhile(lambda x: x in legal, p)) for p in prefixes]
    seeds, acts, fact = search.seeds_under_mutant(c, cut, goal)
    if acts is not None:
        t = search.minimize(search.trace_from_actions(c, acts, fact, mutant), goal)
        return t, "seed-replay", time.perf_counter() - t0
    t, r, _ = search.kill(Encoding(c, stutter=True), depth, seeds if cut else None, goal,
                          timeout_ms=timeout_ms, mutant=mutant)
    return t, r, time.perf_counter() - t0


__all__ = ["Cti", "cti_trace", "find_cti", "finite_query", "reach"]
