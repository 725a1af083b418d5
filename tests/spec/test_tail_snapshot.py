"""``spec.tail.needs_snapshot``, proven with Z3 over every position, ratio and overlap: a
checkpoint skips its tail snapshot exactly where a fresh tail written at H already holds the
rows a resume at H needs (``spec.invariants._sound_at``: rows == tail_need(H))."""
from typing import NamedTuple

import z3

from spec import tail
from spec.common import tail_need, write


class Group(NamedTuple):
    ratio: object
    overlap: object


def _fresh_is_sound(H, c):
    fresh = write(tail.TailRec(), c, H)
    return z3.And(fresh.h == H, fresh.rows == tail_need(H, c.ratio, c.overlap))


def _counterexample(rule):
    """A model of (H, ratio, overlap) where ``rule`` disagrees with the fresh tail's
    soundness, or None when Z3 proves them equal."""
    H, m, ov = z3.Ints("H m overlap")
    c = Group(m, ov)
    s = z3.Solver()
    s.add(H >= 1, m >= 1, ov >= 0, ov <= m)
    s.add(z3.Not(z3.Not(rule(H, c)) == _fresh_is_sound(H, c)))
    return s.model() if s.check() == z3.sat else None


def test_no_snapshot_exactly_where_a_fresh_tail_is_the_state():
    assert _counterexample(tail.needs_snapshot) is None


def test_a_rule_ignoring_the_overlap_is_found_unsound():
    """Skipping every tail on the ratio's boundary (the CSA overlap rows forgotten)."""
    model = _counterexample(lambda H, c: H % c.ratio != 0)
    assert model is not None and model.eval(z3.Int("overlap")).as_long() > 0


def test_a_rule_keeping_every_tail_is_found_too_eager():
    assert _counterexample(lambda H, c: z3.BoolVal(True)) is not None


def test_concrete_groups():
    csa, hca = Group(4, 4), Group(128, 0)
    assert [tail.needs_snapshot(H, hca) for H in (128, 512, 130)] == [False, False, True]
    assert all(tail.needs_snapshot(H, csa) for H in (4, 8, 512, 513))
