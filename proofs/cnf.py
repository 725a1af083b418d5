"""CNF template of one step and its unrolling in a SAT solver (the deep tier's BMC backend).

The transition relation of an ``Encoding`` (the spec's own ``step`` on bit-vectors, nothing
restated) is bit-blasted once by z3 (simplify, bit-blast, tseitin-cnf) into a CNF *template*
over named bits: the current state, the next state, the action selector, the symbolic action
arguments, and one output literal per predicate, ``out_p <=> p(next state)``.  The unrolling
from the initial state (``SatUnrolling``) is built by copying that template once per step into
CaDiCaL (python-sat), the next-state bits of step t being the current-state bits of step t+1.
"""
import time
from typing import NamedTuple

import z3
from pysat.solvers import Solver

from proofs.encode import SYMBOLIC_PARAMS, _tup, flatten

SOLVER = "cadical195"
TACTIC = ("simplify", "bit-blast", "simplify", "tseitin-cnf")


class TemplateError(RuntimeError):
    """Bit-blasting lost part of the step's interface; ``value``: what is missing."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


class Template(NamedTuple):
    nvars: int
    clauses: list    # lists of DIMACS literals over 1..nvars
    cur: list        # per state leaf: variable of bit i (LSB first), or 0 if unused
    nxt: list        # per state leaf: variable of bit i
    sel: list        # selector bits
    args: dict       # parameter -> per component: list of bit variables
    outs: dict       # predicate name -> variable of "holds in the next state"


def _bits(x, vs):
    """Substitution pair: bit-vector ``x`` := the concatenation of Booleans ``vs`` (LSB first)."""
    one, zero = z3.BitVecVal(1, 1), z3.BitVecVal(0, 1)
    parts = [z3.If(b, one, zero) for b in reversed(vs)]
    return x, (z3.Concat(*parts) if len(parts) > 1 else parts[0])


def template(enc, preds):
    """CNF template of one step of ``enc`` with outputs for ``preds`` (name -> predicate)."""
    cur, nxt = enc.state_vars("c"), enc.state_vars("n")
    f, sel, args = enc.step("T", cur, nxt)
    outs = {n: z3.Bool(f"out!{n}") for n in preds}
    body = z3.And(f, *[outs[n] == enc.holds(p, nxt) for n, p in preds.items()])
    bvs = cur + nxt + [sel] + [v for p in SYMBOLIC_PARAMS for v in _tup(args[p])]
    booleans = {str(x): [z3.Bool(f"{x}#{i}") for i in range(x.size())] for x in bvs}
    g = z3.Goal()
    g.add(z3.substitute(body, *[_bits(x, booleans[str(x)]) for x in bvs]))
    res = z3.Then(*TACTIC)(g)
    if len(res) != 1:
        raise TemplateError("bit-blasting did not give one goal", len(res))
    names, clauses, nvars = {}, [], 0
    for line in res[0].dimacs(True).splitlines():
        if line.startswith("p"):
            nvars = int(line.split()[2])
        elif line.startswith("c"):
            _, v, name = line.split(None, 2)
            names[name] = int(v)
        elif line.strip():
            clauses.append([int(x) for x in line.split()[:-1]])

    def var(x):
        return [names.get(b.decl().name(), 0) for b in booleans[str(x)]]

    nx = [var(x) for x in nxt]
    missing = [p for p, bs in zip(enc.paths, nx) if not all(bs)]
    missing += [n for n in preds if f"out!{n}" not in names]
    if missing:     # a next-state bit left free would admit behaviours the spec lacks
        raise TemplateError("template lost next-state bits or outputs", missing[:5])
    return Template(nvars, clauses, [var(x) for x in cur], nx, var(sel),
                    {p: [var(v) for v in _tup(args[p])] for p in SYMBOLIC_PARAMS},
                    {n: names[f"out!{n}"] for n in preds})


class SatUnrolling:
    """init(s0) & T(s0,s1) & ... in one incremental SAT solver (``init=False``: s0 free)."""

    def __init__(self, enc, tpl, solver=SOLVER, init=True):
        self.enc, self.tpl, self.solver = enc, tpl, solver
        self.sol = Solver(name=solver)
        self.top = 0
        self.states = [[self._fresh_bits() for _ in enc.paths]]
        self.steps = []       # per step: (selector bits, args bits) renamed
        self.outs = [None]    # per state: {name: literal}; none for the initial state
        self.maps = []        # per step: template variable -> solver variable
        self.lemmas = [[[v if (x >> i) & 1 else -v]     # per state: clauses about it
                        for bs, x in zip(self.states[0], flatten(enc.template) if init else ())
                        for i, v in enumerate(bs)]]
        for cl in self.lemmas[0]:
            self.sol.add_clause(cl)

    def _fresh_bits(self):
        self.top += self.enc.w
        return list(range(self.top - self.enc.w + 1, self.top + 1))

    @property
    def depth(self):
        return len(self.steps)

    def lemma(self, *lits):
        """Assert the clause ``lits`` (implied by the unrolling, about the last state) for
        good: kept across ``renew``."""
        self.lemmas[-1].append(list(lits))
        self.sol.add_clause(list(lits))

    def renew(self):
        """The same unrolling and lemmas in a fresh solver: nothing learnt is kept (deep
        queries were measured to slow down several-fold under an old solver's state)."""
        self.sol.delete()
        self.sol = Solver(name=self.solver)
        for t, cls in enumerate(self.lemmas):   # in the order they were first given
            if t:
                self._add(self.maps[t - 1])
            for cl in cls:
                self.sol.add_clause(cl)

    def _add(self, m):
        add = self.sol.add_clause
        for cl in self.tpl.clauses:
            add([m[x] if x > 0 else -m[-x] for x in cl])

    def extend(self):
        tpl, m = self.tpl, [0] * (self.tpl.nvars + 1)
        for bs, vs in zip(tpl.cur, self.states[-1]):
            for a, b in zip(bs, vs):
                if a:
                    m[a] = b
        base = self.top
        for v in range(1, tpl.nvars + 1):
            if not m[v]:
                m[v] = base + v
        self.top = base + tpl.nvars
        self.maps.append(m)
        self.lemmas.append([])
        self._add(m)
        self.states.append([[m[v] for v in bs] for bs in tpl.nxt])
        self.steps.append(([m[v] if v else 0 for v in tpl.sel],
                           {p: [[m[v] if v else 0 for v in bs] for bs in comps]
                            for p, comps in tpl.args.items()}))
        self.outs.append({n: m[v] for n, v in tpl.outs.items()})

    def solve(self, assumptions, deadline=None):
        """True/False, or None when ``deadline`` (perf_counter) has passed.  CaDiCaL cannot
        be interrupted from python-sat, so the deadline is only checked before a call."""
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        return self.sol.solve(assumptions=assumptions)

    def actions(self):
        """The concrete action list of the last model (stutter selectors skipped)."""
        model = set(x for x in self.sol.get_model() if x > 0)

        def val(bs):
            return sum(1 << i for i, v in enumerate(bs) if v and v in model)
        acts = []
        for sel, args in self.steps:
            j = val(sel)
            if j >= len(self.enc.inst):
                continue
            ins = self.enc.inst[j]
            out = []
            for a in ins.args:
                if isinstance(a, str):
                    comps = [val(bs) for bs in args[a]]
                    out.append(tuple(comps) if a == "ref" else comps[0])
                else:
                    out.append(a)
            acts.append((ins.name, tuple(out)))
        return acts
