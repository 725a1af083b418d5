"""k-induction over the spec's transition relation.

The property proven is the strengthening S = (every spec invariant) AND (every auxiliary
fact of ``proofs.aux``).  Step case: from k consecutive states satisfying S linked by
transitions, the next state satisfies each conjunct of S.  With the base case (BMC to depth
>= k-1 from the initial state, run by ``proofs.bmc``) an invariant is proven for every reachable
state iff its own step query and those of the whole strengthening are unsat.  A satisfiable
step query yields a counterexample to induction (CTI) as a trace from an arbitrary state.
"""
import time
from typing import NamedTuple

import z3

from proofs import trace as tr
from proofs.encode import unroll


class StepResult(NamedTuple):
    name: str
    k: int
    inductive: bool | None    # None: solver gave up
    seconds: float
    cti: dict | None          # trace dict of a counterexample to induction


def induction_step(enc, props, k=1, names=None, timeout_ms=0, progress=None):
    """Check the k-induction step of every conjunct in ``props`` (name -> predicate), all
    of them assumed on the first k states.  ``names`` restricts which conjuncts are checked."""
    sol, states, steps = unroll(enc, k, start=None, timeout_ms=timeout_ms)
    for vs in states[:-1]:
        for p in props.values():
            sol.add(enc.holds(p, vs))
    out = []
    for name in names or list(props):
        t0 = time.perf_counter()
        sol.push()
        sol.add(z3.Not(enc.holds(props[name], states[-1])))
        r = sol.check()
        cti = None
        if r == z3.sat:
            cti = tr.extract(enc, sol.model(), states, steps, name, kind="cti")
        sol.pop()
        ok = True if r == z3.unsat else (False if r == z3.sat else None)
        out.append(StepResult(name, k, ok, time.perf_counter() - t0, cti))
        if progress:
            progress(name)
    return out


def holds_initially(enc, props):
    """Names of the predicates false in the initial state (evaluated on plain ints)."""
    return [n for n, p in props.items() if not p(enc.template, enc.c)]


def houdini(enc, props, k=1, progress=None):
    """The largest subset of ``props`` that holds initially and is k-inductive on its own
    (drop every conjunct with a CTI, repeat).  Returns (kept names, {dropped name: CTI
    trace or None when false initially})."""
    dropped = {n: None for n in holds_initially(enc, props)}
    while True:
        keep = {n: p for n, p in props.items() if n not in dropped}
        if not keep:
            return [], dropped
        bad = [r for r in induction_step(enc, keep, k, progress=progress) if not r.inductive]
        if not bad:
            return list(keep), dropped
        for r in bad:
            dropped[r.name] = r.cti
