"""Bounded model checking of the spec's invariants, and the vacuity check.

One incremental QF_BV solver holds the unrolling init(s0) & T(s0,s1) & ... & T(s_{d-1},s_d).
At each depth every still-unbroken invariant is checked at s_d under push/pop.  Once a fact
(spec invariant or auxiliary) is known to hold at s_d on *every* trace of length d, it is
asserted there as a lemma: sound by construction, and it keeps deeper queries local (the
auxiliary facts make the strengthening 1-inductive, so a depth-d query needs no search
through the interleavings below d).  Under a mutant a fact that breaks is simply no longer
asserted.
"""
import time
from typing import NamedTuple

import z3

from proofs import trace as tr
from proofs.encode import unroll


class InvResult(NamedTuple):
    name: str
    depth: int            # deepest depth checked without a violation (-1: broken at 0)
    violated: bool
    seconds: float
    trace: dict | None    # counterexample when violated


class BmcResult(NamedTuple):
    invariants: list       # InvResult per spec invariant
    aux_broken: list       # auxiliary facts that did not hold (names)
    reached: int           # deepest depth at which every invariant was checked
    depth: int
    seconds: float
    unknown: bool = False  # the solver gave up


class Bmc:
    """Incremental unrolling of ``enc`` from the initial state."""

    def __init__(self, enc, timeout_ms=0):
        self.enc = enc
        self.sol, self.states, self.steps = unroll(enc, 0, timeout_ms=timeout_ms)

    @property
    def depth(self):
        return len(self.steps)

    def extend(self):
        unroll(self.enc, 1, self.sol, states=self.states, steps=self.steps)

    def query(self, goal, deadline=None):
        """sat/unsat/unknown of ``goal`` on top of the unrolling (goal retracted afterwards);
        returns (result, model or None).  Past ``deadline`` (perf_counter) it gives up."""
        if deadline is not None:
            self.sol.set("timeout", max(1, int((deadline - time.perf_counter()) * 1000)))
        self.sol.push()
        self.sol.add(goal)
        r = self.sol.check()
        m = self.sol.model() if r == z3.sat else None
        self.sol.pop()
        return r, m

    def holds_now(self, pred):
        return self.enc.holds(pred, self.states[-1])

    def trace(self, model, name, mutant=None, upto=None):
        n = self.depth if upto is None else upto
        return tr.extract(self.enc, model, self.states[:n + 1], self.steps[:n], name,
                          mutant=mutant)


def run_bmc(enc, invariants, depth, aux=None, mutant=None, stop_at_first=False,
            stop_when=None, deadline=None):
    """BMC of ``invariants`` (name -> predicate) to ``depth``; ``aux`` facts are checked and
    used as lemmas where they hold.  ``stop_when(d)`` is called after each depth d and ends
    the run (at depth d) when it returns True; a query still running at ``deadline``
    (perf_counter seconds) is abandoned and the run ends at the last complete depth."""
    t_all = time.perf_counter()
    b = Bmc(enc)
    aux = dict(aux or {})
    secs = {n: 0.0 for n in invariants}
    reached = {n: -1 for n in invariants}
    broken, traces, aux_broken = set(), {}, []
    for d in range(depth + 1):
        if d:
            b.extend()
        active = {n: p for n, p in invariants.items() if n not in broken}
        # one query for everything still standing; split only when something breaks
        while active:
            t0 = time.perf_counter()
            preds = {**active, **aux}
            r, m = b.query(z3.Not(z3.And(*[b.holds_now(p) for p in preds.values()])),
                           deadline)
            dt = time.perf_counter() - t0
            for n in active:
                secs[n] += dt / len(active)
            if r == z3.unsat:
                for p in preds.values():
                    b.sol.add(b.holds_now(p))
                for n in active:
                    reached[n] = d
                break
            if r != z3.sat:
                return _result(invariants, reached, broken, secs, traces, aux_broken,
                               d - 1, t_all, unknown=True)
            bad = [n for n, p in preds.items()
                   if z3.is_false(m.eval(b.holds_now(p), model_completion=True))]
            bad_inv = [n for n in bad if n in active]
            if bad_inv:
                for n in bad_inv:
                    broken.add(n)
                    traces[n] = b.trace(m, n, mutant)
                    active.pop(n)
                if stop_at_first:
                    return _result(invariants, reached, broken, secs, traces, aux_broken,
                                   d, t_all)
            else:
                for n in bad:
                    aux.pop(n)
                    aux_broken.append(n)
        if stop_when and stop_when(d) and d < depth:
            return _result(invariants, reached, broken, secs, traces, aux_broken, d,
                           t_all)
    return _result(invariants, reached, broken, secs, traces, aux_broken, depth, t_all)


def _result(invariants, reached, broken, secs, traces, aux_broken, depth, t_all,
            unknown=False):
    out = [InvResult(n, reached[n], n in broken, secs[n], traces.get(n)) for n in invariants]
    return BmcResult(out, aux_broken, min(reached.values(), default=depth), depth,
                     time.perf_counter() - t_all, unknown)
