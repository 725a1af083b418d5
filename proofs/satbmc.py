"""Bounded model checking on a SAT solver: the deep tier's BMC.

The transition relation of an ``Encoding`` (the spec's own ``step`` on bit-vectors, nothing
restated) is bit-blasted once by z3 (simplify, bit-blast, tseitin-cnf) into a CNF *template*
over named bits: the current state, the next state, the action selector, the symbolic action
arguments, and one output literal per predicate, ``out_p <=> p(next state)``.  The unrolling
from the initial state is built by copying that template once per step into CaDiCaL
(python-sat), the next-state bits of step t being the current-state bits of step t+1.

What a depth-d verdict means: at depth d the solver holds init(s0) & T(s0,s1) & ... &
T(s_{d-1},s_d) - the real unrolling, every interleaving - and for each predicate p still
standing it is asked, under the assumption ``not out_p(s_d)``, for a trace.  UNSAT means no
trace of exactly d steps ends in a state violating p; p is then asserted at s_d as a lemma
(sound: it removes no trace), as ``proofs.bmc`` does.  Depths 0..d together cover every
trace of at most d steps.  Splitting the query per predicate (rather than one query
``not (p1 & ... & pn)``) is only a case split: the union of the cases is the whole query;
so is the split on the last step's action instance (``_check``).

Measured on DEEP (3 objects per kind), what made depth 30 reachable: the split per predicate
and per last action (one hard query becomes ~900 easy ones), and a *fresh* solver per depth
holding the unrolling and the lemmas, re-added in the order first given (step clauses, then
that state's lemmas): an incremental solver's accumulated state made single depths take
minutes.  Symmetry and partial-order reduction were not needed, hence not implemented.

A satisfying model is never trusted as is: its selector and argument bits are read back as a
concrete action list, replayed through ``spec.step``, and only a replay that reproduces the
violation is reported (a model that does not replay raises ``SpuriousTrace``).
"""
import time
from typing import NamedTuple

import z3
from pysat.solvers import Solver

from spec.invariants import INVARIANTS

from proofs import search
from proofs import trace as tr
from proofs.bmc import BmcResult, InvResult
from proofs.encode import SYMBOLIC_PARAMS, Encoding, _tup, flatten

SOLVER = "cadical195"
TACTIC = ("simplify", "bit-blast", "simplify", "tseitin-cnf")


class SpuriousTrace(RuntimeError):
    """A SAT model whose action list does not replay to the violation; ``value``: the list."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


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


def sat_bmc(enc, invariants, depth, aux=None, mutant=None, stop_at_first=False,
            stop_when=None, deadline=None, solver=SOLVER, split=True, fresh=True,
            on_query=None):
    """Same contract and result as ``proofs.bmc.run_bmc``, on the SAT backend: BMC of
    ``invariants`` to ``depth`` from the initial state, ``aux`` facts checked and used as
    lemmas where they hold, one query per predicate and depth (``split``: first one per
    action instance of the last step, see ``_check``).  With ``fresh`` each depth starts
    from a fresh solver holding the unrolling and the lemmas.  ``on_query(depth, name,
    seconds)`` is told the cost of every predicate's query."""
    t_all = time.perf_counter()
    aux = dict(aux or {})
    preds = {**invariants, **aux}
    u = SatUnrolling(enc, template(enc, preds), solver)
    secs = {n: 0.0 for n in invariants}
    reached = {n: -1 for n in invariants}
    broken, traces, aux_broken = set(), {}, []

    def result(d, unknown=False):
        out = [InvResult(n, reached[n], n in broken, secs[n], traces.get(n))
               for n in invariants]
        return BmcResult(out, aux_broken, min(reached.values(), default=d), d,
                         time.perf_counter() - t_all, unknown)

    for n, p in preds.items():      # depth 0: the initial state, on plain ints
        if p(enc.template, enc.c):
            continue
        if n in invariants:
            broken.add(n)
            traces[n] = search.trace_from_actions(enc.c, [], n, mutant)
        else:
            aux.pop(n)
            aux_broken.append(n)
    if broken and stop_at_first:
        return result(0)
    for n in invariants:
        reached[n] = -1 if n in broken else 0
    for d in range(1, depth + 1):
        if fresh and d > 1:
            u.renew()
        u.extend()
        for n in [n for n in {**invariants, **aux} if n not in broken]:
            t0 = time.perf_counter()
            r = _check(u, d, n, split, deadline)
            dt = time.perf_counter() - t0
            if n in secs:
                secs[n] += dt
            if on_query:
                on_query(d, n, dt)
            if r is None:
                return result(d - 1, unknown=True)
            if not r:
                u.lemma(u.outs[d][n])
                continue
            acts = u.actions()
            t = search.trace_from_actions(enc.c, acts, n, mutant)
            if not tr.replay(t, preds).reproduced:
                raise SpuriousTrace(f"model for {n} at depth {d} does not replay", acts)
            if n in invariants:
                broken.add(n)
                traces[n] = t
                if stop_at_first:
                    return result(d)
            else:
                aux.pop(n)
                aux_broken.append(n)
        for n in invariants:
            if n not in broken:
                reached[n] = d
        if stop_when and stop_when(d) and d < depth:
            return result(d)
    return result(depth)


def _check(u, d, n, split, deadline):
    """Is there a trace of ``d`` steps from init ending where predicate ``n`` is false?
    True (the model is in the solver), False, or None (deadline).

    With ``split``, first a case split on the last step's action instance j: each UNSAT
    case (sel = j and not n) is kept as the implied clause (sel != j or n); the final query
    over the whole unrolling, with no case assumed, is then decided by those clauses and the
    step's own ``sel < number of instances`` constraint.  The cases are only a route to the
    same full query; it alone gives the verdict."""
    lit = u.outs[d][n]
    if split:
        sel = u.steps[d - 1][0]
        for j in range(len(u.enc.inst)):
            bits = [v if (j >> i) & 1 else -v for i, v in enumerate(sel) if v]
            r = u.solve([-lit] + bits, deadline)
            if r is not False:
                return r
            u.lemma(*[-b for b in bits], lit)
    return u.solve([-lit], deadline)


def deep_bmc(c, depth=30, budget_s=None, tick=lambda *_: None, invariants=INVARIANTS,
             aux=None, mutant=None, stop_at_first=False, on_query=None, split=True,
             fresh=True):
    """The deep tier's BMC of configuration ``c``: ``sat_bmc`` to ``depth`` with the
    auxiliary facts as lemmas (default ``proofs.aux.AUX``), giving up (``unknown``, with
    ``reached`` the last complete depth) after ``budget_s`` seconds.  Build it while the
    mutant of interest, if any, is applied.  ``tick(msg)`` is called after each depth."""
    if aux is None:
        from proofs.aux import AUX
        aux = AUX
    t0 = time.perf_counter()
    deadline = None if budget_s is None else t0 + budget_s

    def each(d):
        tick(f"sat-bmc depth {d} ({time.perf_counter() - t0:.0f}s)")
        return False

    return sat_bmc(Encoding(c), invariants, depth, aux=aux, mutant=mutant,
                   stop_at_first=stop_at_first, stop_when=each, deadline=deadline,
                   on_query=on_query, split=split, fresh=fresh)
