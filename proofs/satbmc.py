"""Bounded model checking on a SAT solver: the deep tier's BMC.

The transition relation of an ``Encoding`` is bit-blasted once into a CNF template and
unrolled from the initial state in CaDiCaL, one template copy per step (``proofs.cnf``:
``template``, ``SatUnrolling``); this module runs the BMC queries on that unrolling.

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

from spec.invariants import INVARIANTS

from proofs import search
from proofs import trace as tr
from proofs.bmc import BmcResult, InvResult
from proofs.cnf import SOLVER, TACTIC, SatUnrolling, Template, TemplateError, template
from proofs.encode import Encoding

__all__ = ["SOLVER", "TACTIC", "SatUnrolling", "SpuriousTrace", "Template", "TemplateError",
           "deep_bmc", "sat_bmc", "template"]


class SpuriousTrace(RuntimeError):
    """A SAT model whose action list does not replay to the violation; ``value``: the list."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


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
