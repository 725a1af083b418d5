"""Finding real traces: vacuity witnesses, seeded kill searches, trace minimisation.

Every trace this module returns has been replayed on plain ints through ``spec.step``; a
solver model is only ever a suggestion.  Deep traces (about 15 steps before a request runs)
are found by one satisfiable query at a fixed depth with stutter steps, never by proving
every shallower depth unsatisfiable first (that is what makes plain BMC slow here).
"""
import time

import z3

from spec.invariants import INVARIANTS
from spec.state import initial
from spec.step import actions, step

from proofs import trace as tr
from proofs.encode import INIT, flatten, unroll


def trace_from_actions(c, acts, invariant, mutant=None, kind="bmc"):
    """Trace dict of the concrete action list ``acts`` (run through ``spec.step`` with
    whatever mutant is in force), with the changed fields of every step."""
    from proofs.encode import leaf_paths
    s = initial(c)
    paths = leaf_paths(s)
    steps = []
    for name, args in acts:
        s2 = step(s, c, name, args)[1]
        changes = {p: [a, b] for p, a, b in zip(paths, flatten(s), flatten(s2)) if a != b}
        steps.append({"action": name, "args": [list(a) if isinstance(a, tuple) else a
                                               for a in args], "changes": changes})
        s = s2
    return {"config": c._asdict(), "mutant": mutant, "kind": kind, "invariant": invariant,
            "start": None, "steps": steps, "violated_at": len(steps), "aux": None}


def actions_of(trace):
    return [(r["action"], tuple(tuple(a) if isinstance(a, list) else a for a in r["args"]))
            for r in trace["steps"]]


def minimize(trace, invariants=INVARIANTS):
    """Greedily drop steps while the replay still reproduces the same violation."""
    c = tr.config_of(trace)
    acts = actions_of(trace)
    j = 0
    while j < len(acts):
        cand = acts[:j] + acts[j + 1:]
        t = trace_from_actions(c, cand, trace["invariant"], trace["mutant"], trace["kind"])
        if tr.replay(t, invariants).reproduced:
            acts = cand
        else:
            j += 1
    return trace_from_actions(c, acts, trace["invariant"], trace["mutant"], trace["kind"])


def enabled_along(c, acts):
    """Action names enabled in some state along the concrete run of ``acts``."""
    all_acts = actions(c)
    s, seen = initial(c), set()
    for n in range(len(acts) + 1):
        for name, args in all_acts:
            if name not in seen and step(s, c, name, args)[0]:
                seen.add(name)
        if n < len(acts):
            s = step(s, c, *acts[n])[1]
    return seen


def _run(c, acts):
    """Final state of ``acts`` from the initial state, or None if some step is disabled."""
    s = initial(c)
    for name, args in acts:
        en, s = step(s, c, name, args)
        if not en:
            return None
    return s


def _enabled_now(c, s, name):
    return any(step(s, c, n, a)[0] for n, a in actions(c) if n == name)


def shortest_witness(c, acts, name):
    """The shortest prefix of ``acts`` after which ``name`` is enabled, then greedily
    without every step it does not need (clean seeds make kill searches short)."""
    s = initial(c)
    for n in range(len(acts) + 1):
        if _enabled_now(c, s, name):
            acts = acts[:n]
            break
        if n < len(acts):
            s = step(s, c, *acts[n])[1]
    j = 0
    while j < len(acts):
        cand = acts[:j] + acts[j + 1:]
        s = _run(c, cand)
        if s is not None and _enabled_now(c, s, name):
            acts = cand
        else:
            j += 1
    return acts


def _model_actions(enc, model, states, steps):
    t = tr.extract(enc, model, states, steps, "-")
    return actions_of(t)


def witnesses(enc, depth, timeout_ms=0, progress=None):
    """Vacuity: {action name: concrete action list from the initial state after which (or
    along which) it is enabled}; names missing were not shown enabled within ``depth``.
    ``enc`` must have stutter steps."""
    c = enc.c
    names = {ins.name for ins in enc.inst}
    got = {}
    for name in enabled_along(c, []):
        got[name] = []
    sol, states, steps = unroll(enc, depth, timeout_ms=timeout_ms)
    while names - set(got):
        goal = z3.Or(*[enc.enabled_at(n, vs) for n in sorted(names - set(got))
                       for vs in states[-1:]])
        sol.push()
        sol.add(goal)
        r = sol.check()
        m = sol.model() if r == z3.sat else None
        sol.pop()
        if m is None:
            break
        acts = _model_actions(enc, m, states, steps)
        new = enabled_along(c, acts) - set(got)
        if not new:
            break
        for name in new:
            got[name] = shortest_witness(c, acts, name)
        if progress:
            progress(sorted(new))
    return got


def seeds_under_mutant(c, prefixes, invariants=INVARIANTS):
    """Replay every prefix (and each of its own prefixes) under the mutant in force.
    Returns (seeds {flat state: action list}, actions, invariant): ``actions`` is a prefix
    that already breaks ``invariant`` under the mutant, else both are None."""
    seeds = {}
    for acts in prefixes:
        s, done = initial(c), []
        seeds.setdefault(tuple(flatten(s)), [])
        for name, args in acts:
            en, s2 = step(s, c, name, args)
            if not en:
                break
            s, done = s2, done + [(name, args)]
            seeds.setdefault(tuple(flatten(s)), list(done))
            bad = [n for n, p in invariants.items() if not p(s, c)]
            if bad:
                return seeds, list(done), bad[0]
    return seeds, None, None


def kill(enc, depth, start=None, invariants=INVARIANTS, timeout_ms=0, mutant=None):
    """One satisfiable-or-not query: some invariant false after ``depth`` (stutter) steps
    from the initial state or from a seed ({flat state: action list}).  Returns a replayed,
    minimised trace, or (None, "unsat"|"unknown")."""
    t0 = time.perf_counter()
    sol, states, steps = unroll(enc, depth, start=list(start) if start else INIT,
                                timeout_ms=timeout_ms)
    sol.add(z3.Not(z3.And(*[enc.holds(p, states[-1]) for p in invariants.values()])))
    r = sol.check()
    if r != z3.sat:
        return None, str(r), time.perf_counter() - t0
    m = sol.model()
    prefix = []
    if start:
        s0 = tuple(m.eval(v, model_completion=True).as_long() for v in states[0])
        prefix = start[s0]
    acts = prefix + _model_actions(enc, m, states, steps)
    for name in invariants:
        t = trace_from_actions(enc.c, acts, name, mutant)
        if tr.replay(t, invariants).reproduced:
            return minimize(t, invariants), "sat", time.perf_counter() - t0
    return None, "spurious", time.perf_counter() - t0
