"""Explicit-state breadth-first search over the spec's ``step`` on a tiny configuration."""
import time
from collections import deque
from typing import NamedTuple

from spec.invariants import INVARIANTS
from spec.step import actions, step


class BfsResult(NamedTuple):
    states: int
    transitions: int
    seconds: float
    violation: tuple | None     # (invariant name, trace of (action, args) from the initial state)
    never_enabled: list         # action names never enabled in any reachable state


def bfs(c, init, step_fn=step, invariants=INVARIANTS, max_states=None):
    """Visit every reachable state; stop at the first invariant violation with a shortest
    trace.  ``step_fn`` lets tests plug in a seeded-bug variant of ``step``."""
    t0 = time.perf_counter()
    acts = actions(c)
    parent = {init: None}
    queue = deque([init])
    enabled_names, transitions = set(), 0
    while queue:
        s = queue.popleft()
        for name, inv in invariants.items():
            if not inv(s, c):
                return BfsResult(len(parent), transitions, time.perf_counter() - t0,
                                 (name, _trace(parent, s)), [])
        for name, args in acts:
            en, s2 = step_fn(s, c, name, args)
            if not en:
                continue
            enabled_names.add(name)
            transitions += 1
            if s2 not in parent:
                parent[s2] = (s, (name, args))
                queue.append(s2)
        if max_states and len(parent) > max_states:
            break
    never = sorted({n for n, _ in acts} - enabled_names)
    return BfsResult(len(parent), transitions, time.perf_counter() - t0, None, never)


def _trace(parent, s):
    out = []
    while parent[s] is not None:
        s, act = parent[s]
        out.append(act)
    return out[::-1]
