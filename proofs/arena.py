"""State routing over the block arena (``spec.arena``, ``spec.arena_system``): BMC and
1-induction at a fixed size, guard mutants with counterexample traces.

``ArenaEncoding`` is ``spec.arena_system.step`` on bit-vector states, with the interface of
``proofs.encode.Encoding`` (``state_vars``/``init``/``step``/``holds``, ``inst``, ``paths``),
so ``proofs.bmc.run_bmc``, ``proofs.induction`` and ``proofs.trace`` run on it unchanged.
The block b and pages p, q of every action are per-step variables, the pool and the event
concrete (one action instance each).  Nothing restates a guard: every instance is the spec's
own step, with the spec's ``can_take``/``can_give`` in it.
"""
import time
from typing import NamedTuple

import z3

from spec import dual
from spec.arena import GUARDS
from spec.arena_system import (INVARIANTS, PARAMS, ArenaConfig, action, domains, initial,
                               moves, step)

from proofs.bmc import run_bmc
from proofs.encode import FlatEncoding, Instance, _bool, _bv
from proofs.flat import flatten, leaf_paths
from proofs.induction import holds_initially, induction_step
from proofs.mutate import Mutant, applied, mutants

ARGS = ("b", "p", "q")
CONFIG = ArenaConfig()


def width_for(c):
    """Bits with every value (counts included, doubled) in [0, 2**(w-1)): signed ``<`` on
    the bit-vectors agrees with Python's."""
    bound = max(c.n_pages, c.n_blocks * len(c.pools), max(g for _, g in c.pools), 8)
    return (2 * bound + 1).bit_length() + 1


class ArenaEncoding(FlatEncoding):
    """The arena system's transition relation over template variables (build it while the
    mutants of interest are applied); ``stutter`` adds a no-op so depth d covers shorter
    traces."""

    def __init__(self, c=CONFIG, stutter=False):
        self.c, self.stutter, self._preds = c, stutter, {}
        self.w = width_for(c)
        dual.set_width(self.w)
        self.template = initial(c)
        self.paths = leaf_paths(self.template)
        self.cur = [z3.BitVec(f"s!{p}", self.w) for p in self.paths]
        self.argvars = {a: z3.BitVec(f"a!{a}", self.w) for a in ARGS}
        s, doms = self.sym(self.cur), domains(c)
        self.inst, self.enabled, nxt = [], [], []
        for j, (kind, _) in enumerate(c.pools):
            for event in sorted(moves(kind)):
                params = PARAMS[action(kind, event)]
                en, s2 = step(s, c, event, (j, *[self.argvars[a] for a in params]))
                dom = [z3.ULT(self.argvars[a], len(doms[a])) for a in params]
                self.inst.append(Instance(event, (j, *params), ("j", *params)))
                self.enabled.append(z3.simplify(z3.And(_bool(en), *dom)))
                nxt.append([z3.simplify(_bv(x, self.w)) for x in flatten(s2)])
        self.sel_w = len(self.inst).bit_length() + 1
        self.changes = [[(j, leaves[n]) for j, leaves in enumerate(nxt)
                         if not leaves[n].eq(self.cur[n])] for n in range(len(self.paths))]

    def step(self, t, vs, ws):
        """Constraint: ``ws`` follows ``vs`` by the instance selector ``sel!t`` names."""
        args = {a: z3.BitVec(f"a{t}!{a}", self.w) for a in ARGS}
        sub = list(zip(self.cur, vs)) + [(self.argvars[a], args[a]) for a in ARGS]
        constraint, sel = self._select(t, vs, ws, sub)
        return constraint, sel, args


# ---- the proof -----------------------------------------------------------------------------
def prove_arena(c=CONFIG, depth=4, budget_s=120.0):
    """BMC of every arena invariant to ``depth`` (within ``budget_s``) and the 1-induction
    step of their conjunction.  Rows as ``proofs.run.prove_invariants`` gives them, and the
    counterexample traces (BMC violations, CTIs)."""
    enc = ArenaEncoding(c)
    deadline = time.perf_counter() + budget_s
    bmc = run_bmc(enc, INVARIANTS, depth, stop_when=lambda d: time.perf_counter() > deadline,
                  deadline=deadline)
    bad_init = set(holds_initially(enc, INVARIANTS))
    ind = {r.name: r for r in induction_step(enc, INVARIANTS, 1)}
    all_inductive = not bad_init and all(r.inductive for r in ind.values())
    rows, traces = [], []
    for b in bmc.invariants:
        violated = b.violated or b.name in bad_init
        inductive = all_inductive and bool(ind[b.name].inductive)
        rows.append({"name": b.name, "method": "bmc+1-induction", "depth": b.depth,
                     "inductive": inductive,
                     "result": "violated" if violated else ("proven" if inductive else "unknown"),
                     "seconds": round(b.seconds + ind[b.name].seconds, 3)})
        traces += [t for t in (b.trace, ind[b.name].cti) if t]
    return rows, traces


def guard_mutants(only=()):
    """The mutants of ``can_take`` / ``can_give`` (``proofs.mutate``), those named in
    ``only`` when it names any."""
    return [m for m in mutants(GUARDS) if not only or m.name in only]


class ArenaMutant(NamedTuple):
    mutant: Mutant
    killed: bool
    how: str           # bmc (a trace from the initial state) / redundant / not-killed
    invariant: str     # the invariant the trace breaks ("" when not killed)
    seconds: float
    trace: dict | None


def mutate_arena(c=CONFIG, depth=6, only=()):
    """Each conjunct of ``can_take``/``can_give`` replaced by True: killed when BMC finds a
    trace from the initial state that breaks an invariant."""
    out = []
    for m in guard_mutants(only):
        t0 = time.perf_counter()
        with applied(m, GUARDS):
            enc = ArenaEncoding(c)
            bmc = run_bmc(enc, INVARIANTS, depth, mutant=m.as_json(), stop_at_first=True)
            broken = [r for r in bmc.invariants if r.violated]
            how, inv, trace = "not-killed", "", None
            if broken:
                how, inv, trace = "bmc", broken[0].name, broken[0].trace
            elif all(r.inductive for r in induction_step(enc, INVARIANTS, 1)):
                how = "redundant: every invariant stays inductive without it"
        out.append(ArenaMutant(m, bool(broken), how, inv, time.perf_counter() - t0, trace))
    return out


def replay(trace):
    """Re-run a trace from the initial state through ``spec.arena_system.step`` on ints (with
    whatever mutant is applied now; a refused step changes nothing): (every step enabled,
    the invariants false at the end)."""
    c = ArenaConfig(**{k: _tuples(v) for k, v in trace["config"].items()})
    s, ok = initial(c), True
    for rec in trace["steps"]:
        en, s2 = step(s, c, rec["action"], tuple(rec["args"]))
        ok, s = ok and bool(en), s2 if en else s
    return ok, [n for n, f in INVARIANTS.items() if not f(s, c)]


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v
