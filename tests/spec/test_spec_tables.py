"""The compiled hot-path tables and the python-statemachine classes agree on every
(state, event, guard outcome)."""
import random

import pytest
from statemachine.exceptions import TransitionNotAllowed

import spec
from hybridkv.cache.tables import CheckedMachine, Table, TransitionRefused, table_for
from spec.config import Ctx, SysConfig
from spec.disk import DiskRec
from spec.state import MACHINES, RECS

RECORD = dict(zip(MACHINES, RECS))
RECORD[spec.MACHINES["disk"]] = DiskRec


def _random_record(cls, rng):
    return cls(*[rng.choice((0, 0, 1, 1, 2, 3)) for _ in cls._fields])


@pytest.mark.parametrize("name", sorted(spec.MACHINES))
def test_table_matches_machine_on_every_state_event_and_guard_outcome(name):
    cls = spec.MACHINES[name]
    table = Table(cls)
    rng = random.Random(7)
    outcomes = {}
    for _ in range(60):
        o = _random_record(RECORD[cls], rng)
        c = Ctx(SysConfig(), rng.randint(0, 1))
        for state in cls.states:
            for event in cls.events:
                expected = table.target(state.value, event.id, o, c)
                sm = cls(start_value=state.value)
                try:
                    sm.send(event.id, o=o, c=c)
                    got = sm.current_state_value
                except TransitionNotAllowed:
                    got = None
                assert got == expected, (name, state.id, event.id, o)
                for guards, _ in table.rows.get((state.value, event.id), ()):
                    for g in guards:
                        outcomes.setdefault((state.id, event.id, g.__name__), set()).add(
                            bool(g(o, c)))
    # every guard was seen both true and false, so both branches were compared
    assert all(v == {True, False} for v in outcomes.values()), outcomes


def test_table_fire_refuses_with_named_error():
    t = table_for(spec.MACHINES["compressed"])
    rec = RECS[0]()
    with pytest.raises(TransitionRefused) as e:
        t.fire(rec.st, "seal", rec, Ctx(SysConfig(), 0))
    assert e.value.event == "seal" and e.value.state == "free"


def test_checked_machine_detects_disagreement():
    cls = spec.MACHINES["compressed"]
    shadow = CheckedMachine(table_for(cls))
    rec, c = RECS[0](), Ctx(SysConfig(), 0)
    shadow.follow(0, "write", rec, c, expected=1)
    with pytest.raises(AssertionError):
        shadow.follow(1, "reject", rec, c, expected=2)   # the machine goes to free, not ready
