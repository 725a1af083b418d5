"""Parametric tier (issue 22): proofs for every number of objects, requests, disk slots and
graphs, and a seeded bug that only shows beyond the deep tier's sizes.

The seeded bug: a pin count kept in a 2-bit saturating counter (``pins = min(pins + 1, 3)``).
It needs four holders of one block (three requests and a spill); FAST and DEEP have two
requests and one disk slot, so at most three holders: they cannot see it."""
import pytest
import z3

from spec import INVARIANTS, common, initial, step

from proofs.parametric import PEncoding, check, prove_fact
from proofs.run import DEEP, FAST


def _saturating_pin(o, c):
    """Seeded bug: the pin count saturates at 3 (a 2-bit field): min(pins + 1, 3), written
    with what spec.common's namespace has (the code runs there)."""
    return o._replace(pins=o.pins + 1 + 3 - Max(o.pins + 1, 3))  # noqa: F821


class seeded_pin_bug:
    def __enter__(self):
        self.real = common.pin.__code__
        common.pin.__code__ = _saturating_pin.__code__

    def __exit__(self, *exc):
        common.pin.__code__ = self.real


def _four_holders(c):
    """Every kind written, published and sealed at H=4; three requests look it up and pin
    it; then a spill pins it too (the fourth holder)."""
    acts = []
    for k in range(4):
        acts += [("write", (k, 0, 4)), ("fill", (k, 0)), ("publish", (k, 0)), ("seal", (k, 0))]
    for r in range(c.n_req):
        acts += [("lookup", (r, (0, 0, 0, 0), 4)), ("pin", (r,))]
    acts += [("spill_start", (0, 0, 0))]
    s = initial(c)
    for name, args in acts:
        en, s = step(s, c, name, args)
        assert en, (name, args)
    return s


@pytest.fixture(scope="module")
def enc():
    return PEncoding(FAST)


@pytest.mark.parametrize("name", [
    "static_topology", pytest.param("admission_cap", marks=pytest.mark.slow),
    pytest.param("toctou", marks=pytest.mark.slow)])
def test_parametric_proves_for_every_size(enc, name):
    r = prove_fact(enc, name, timeout_ms=60_000)
    assert r.result == "proven-all-sizes", r


def test_seeded_bug_is_real_beyond_deep():
    """Three requests and one disk slot: the concrete spec run breaks well_formed (pins no
    longer count the holders); the real pin keeps it."""
    c = FAST._replace(n_req=3)
    assert c.n_req > DEEP.n_req
    assert INVARIANTS["well_formed"](_four_holders(c), c)
    with seeded_pin_bug():
        assert not INVARIANTS["well_formed"](_four_holders(c), c)


@pytest.mark.slow
def test_parametric_tier_finds_the_seeded_bug(enc):
    """The same bug: the all-sizes induction of well_formed over a spill, which the real spec
    passes, no longer goes through (Z3 cannot certify pins = holders once a fourth holder
    leaves the count at 3).  Z3 answers unknown rather than sat here (the quantifiers are
    over integer fields), so the concrete run above is what shows the failure is real."""
    a = next(j for j, ins in enumerate(enc.inst) if ins.name == "spill_start")
    assert check(enc.step_query("well_formed", a), 60_000) == z3.unsat
    with seeded_pin_bug():
        e = PEncoding(FAST)
    assert check(e.step_query("well_formed", a), 20_000) != z3.unsat


@pytest.mark.slow
def test_deep_tier_misses_the_seeded_bug():
    """DEEP's BMC and 1-induction still prove every invariant under the bug: at most three
    holders exist there, so the counter never saturates."""
    from proofs.aux import AUX
    from proofs.bmc import run_bmc
    from proofs.encode import Encoding
    from proofs.induction import induction_step
    with seeded_pin_bug():
        e = Encoding(DEEP)
        res = induction_step(e, {**INVARIANTS, **AUX}, 1)
        assert all(r.inductive for r in res), [r.name for r in res if not r.inductive]
        bmc = run_bmc(e, INVARIANTS, 4, aux=AUX)
        assert not [r.name for r in bmc.invariants if r.violated]
