"""Machine classes -> flat ``event -> [(source, guards, target)]`` tables.

python-statemachine is the declaration; the tables carry the very same guard functions,
so ``fire`` (dual-mode, used by ``step``) and the runtime's hot path agree with the classes
by construction (a test checks every (state, event, guard outcome) anyway).
"""
from functools import lru_cache
from typing import NamedTuple

from spec.dual import And, Or, Ite


class Row(NamedTuple):
    source: int
    guards: tuple
    target: int


@lru_cache(maxsize=None)
def compile_machine(cls):
    """Rows per event in declaration order (python-statemachine takes the first whose
    conditions all hold)."""
    table = {}
    for state in cls.states:
        for t in state.transitions:
            guards = tuple(spec.func for spec in t.cond)
            for event in t.events:
                table.setdefault(str(event), []).append(
                    Row(state.value, guards, t.target.value))
    return {ev: tuple(rows) for ev, rows in table.items()}


def fire(cls, event, st, o, c):
    """(enabled, target state) of ``event`` from state ``st`` with record ``o``."""
    rows = compile_machine(cls)[event]
    hits = [And(st == r.source, *[g(o, c) for g in r.guards]) for r in rows]
    target = st
    for hit, r in reversed(list(zip(hits, rows))):
        target = Ite(hit, r.target, target)
    return Or(*hits), target
