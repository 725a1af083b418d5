"""Guard mutation on the parametric tier (``hybridkv prove --parametric --mutate``).

A guard mutant (``proofs.mutate``: one conjunct of one guard replaced by True) changes only
the action instances whose step calls that guard (``PEncoding.users``: found by running
each instance's ``spec.step`` under a profiler; every instance when a fact calls it).  So
only those instances' induction steps are checked again, over every fact of S; the other
steps are the unmutated encoding's, which the baseline (``prove_parametric``) proves once.

Per mutant, within ``budget_s``:
1. a finite CTI is searched on each changed instance, every fact at once, with at most 1
   then ``kmax`` elements per sort (``proofs.cti``; replayed on plain ints under the mutant);
2. if none is found, every (changed instance, fact) step is proven as the baseline proves
   it (E-matching, then MBQI on the full and the lean query).
Verdicts: ``killed`` by ``cti`` (a finite CTI: its sizes recorded), by ``model`` (Z3 gives a
model of the all-sizes step, no finite one that small), by ``unknown`` (Z3 gives up on a step
the unmutated encoding proves at the same limit) or by ``timeout`` (the budget ran out before
every changed step was decided); ``redundant`` when every changed step is still proven (the
conjunct does not matter to any fact, at any size: the survivor's argument is that proof);
``unused`` when no step calls the guard; ``undecided`` when Z3 gives up on the step unmutated
as well (no verdict at this limit).
"""
import time
from typing import NamedTuple

import z3

from proofs.cti import find_cti
from proofs.mutate import applied
from proofs.parametric import props, size_text


class PMutantResult(NamedTuple):
    mutant: object     # proofs.mutate.Mutant
    result: str        # killed | redundant | unused | undecided
    how: str           # killed: cti | model | unknown | timeout; else why it survived
    action: str        # the changed step that is not proven ("" when none)
    fact: str          # the fact it breaks or Z3 could not keep ("" when none)
    sizes: dict | None  # a finite CTI's sizes (n_obj, n_req, n_disk, n_graph)
    steps: int         # (instance, fact) step queries proven under the mutant
    seconds: float
    trace: dict | None  # the CTI (proofs.trace dict, kind "cti", its mutant named)

    @property
    def killed(self):
        return self.result == "killed"

    def as_json(self):
        return {"mutant": self.mutant.name, "guard": self.mutant.guard,
                "conjunct": self.mutant.conjunct, "result": self.result, "how": self.how,
                "action": self.action, "fact": self.fact, "sizes": self.sizes,
                "steps": self.steps, "seconds": round(self.seconds, 2)}

    def line(self):
        what = {"killed": f"killed by {self.how}: {self.fact} after {self.action}",
                "redundant": f"SURVIVED (redundant): {self.how}",
                "unused": f"SURVIVED (unused): {self.how}",
                "undecided": f"UNDECIDED: {self.how}"}[self.result]
        if self.sizes:
            what += f" at {size_text(self.sizes)}"
        return f"{self.mutant.name:<28} {what}  {self.seconds:.1f}s"


class MutationRun:
    """The baseline encoding, and the baseline's verdict on each step it was asked about
    (cached: a mutant's unknown counts as a kill only where the baseline proves that step
    at the same limit)."""

    def __init__(self, enc, timeout_ms=60_000, budget_s=600.0, kmax=2):
        self.enc, self.timeout_ms, self.budget_s, self.kmax = enc, timeout_ms, budget_s, kmax
        self.names = list(props())
        self.baseline = {}

    def _baseline(self, name, a):
        if (name, a) not in self.baseline:
            self.baseline[(name, a)] = self.enc.prove_step(name, a, self.timeout_ms)
        return self.baseline[(name, a)]

    def one(self, m, among=None):
        """The verdict on mutant ``m`` (a ``PMutantResult``); ``among``: only these
        instance numbers are checked (default: every instance)."""
        t0 = time.perf_counter()
        deadline = t0 + self.budget_s

        def done(result, how, a=None, fact="", cti=None, steps=0):
            act = "" if a is None else self.enc.inst[a].name
            return PMutantResult(m, result, how, act, fact, cti.sizes if cti else None, steps,
                                 time.perf_counter() - t0, cti.trace if cti else None)

        users = self.enc.users(m.guard, among)
        if not users:
            return done("unused", "no step of the model calls this guard")
        with applied(m):
            var = self.enc.variant(users)
            for a in users:
                left = (deadline - time.perf_counter()) * 1000
                if left <= 0:
                    return done("killed", "timeout", a)
                cti = find_cti(var, self.names, a, props(), self.kmax, left, m.as_json())
                if cti is not None:
                    return done("killed", "cti", a, cti.fact, cti)
            steps = 0
            for a in users:
                for name in self.names:
                    left = int((deadline - time.perf_counter()) * 1000)
                    if left <= 0:
                        return done("killed", "timeout", a, name, steps=steps)
                    r = var.prove_step(name, a, min(self.timeout_ms, left))
                    if r is None or r == z3.unsat:
                        steps += r is not None
                        continue
                    if r == z3.sat:
                        return done("killed", "model", a, name, steps=steps)
                    if self._baseline(name, a) != z3.unsat:
                        return done("undecided", f"Z3 gives up on {name} after "
                                    f"{self.enc.inst[a].name} unmutated too", a, name,
                                    steps=steps)
                    return done("killed", "unknown", a, name, steps=steps)
        return done("redundant", f"every fact's step over the {len(users)} instance(s) "
                    f"calling it is proven without the conjunct", steps=steps)


def mutate_parametric(enc, todo, timeout_ms=60_000, budget_s=600.0, kmax=2,
                      tick=lambda *_: None):
    """Every mutant of ``todo`` on the parametric encoding ``enc`` (built unmutated):
    list of ``PMutantResult``."""
    run = MutationRun(enc, timeout_ms, budget_s, kmax)
    out = []
    for m in todo:
        out.append(run.one(m))
        tick(f"mutant {m.name}: {out[-1].result}")
    return out


__all__ = ["MutationRun", "PMutantResult", "mutate_parametric"]
