"""Parametric tier (issue 22): proofs for every number of objects, requests, disk slots and
graphs, and a seeded bug that only shows beyond the deep tier's sizes.

The seeded bug: a pin count kept in a 2-bit saturating counter (``pins = min(pins + 1, 3)``).
It needs four holders of one block (three requests and a spill, or two requests and two
spills); FAST and DEEP have two requests and one disk slot, so at most three holders: they
cannot see it."""
import pathlib

import pytest

from spec import INVARIANTS, common, initial, step

from proofs import search
from proofs import trace as tr
from proofs.cti import find_cti, reach
from proofs.parametric import PEncoding, prove_fact, props
from proofs.run import DEEP, FAST

GOLDEN = sorted((pathlib.Path(__file__).parents[1] / "golden").glob("*.json"))


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


def _beyond_deep(sizes):
    """Some sort has more elements than DEEP gives it."""
    return any(sizes[f] > getattr(DEEP, f) for f in ("n_obj", "n_req", "n_disk", "n_graph"))


@pytest.mark.parametrize("name", [
    "static_topology", pytest.param("admission_cap", marks=pytest.mark.slow),
    pytest.param("toctou", marks=pytest.mark.slow)])
def test_parametric_proves_for_every_size(penc, name):
    r = prove_fact(penc, name, timeout_ms=60_000)
    assert r.result == "proven-all-sizes", r


def test_seeded_bug_is_real_beyond_deep():
    """Three requests and one disk slot: the concrete spec run breaks well_formed (pins no
    longer count the holders); the real pin keeps it."""
    c = FAST._replace(n_req=3)
    assert c.n_req > DEEP.n_req
    assert INVARIANTS["well_formed"](_four_holders(c), c)
    with seeded_pin_bug():
        assert not INVARIANTS["well_formed"](_four_holders(c), c)


def test_finite_cti_of_the_seeded_bug_is_beyond_deep(penc):
    """The all-sizes step of well_formed over a spill: unmutated, no CTI with at most two
    elements per sort; under the bug, one, whose size is beyond DEEP's, and which replays on
    plain ints (S holds before, the spill breaks pins = holders) only under the bug."""
    a = next(j for j, ins in enumerate(penc.inst) if ins.name == "spill_start")
    assert find_cti(penc, ["well_formed"], a, props(), kmax=2) is None
    with seeded_pin_bug():
        cti = find_cti(penc.variant([a]), ["well_formed"], a, props(), kmax=2)
        assert cti is not None
        assert tr.replay(cti.trace, props()).reproduced
    assert (cti.fact, cti.action) == ("well_formed", "spill_start")
    assert _beyond_deep(cti.sizes), cti.sizes
    assert tr.config_of(cti.trace)._asdict() == {**FAST._asdict(), **cti.sizes}
    assert not tr.replay(cti.trace, props()).reproduced


@pytest.mark.slow
def test_parametric_tier_finds_the_seeded_bug():
    """The parametric tier's own path on the bug (``prove_fact``, as ``prove --parametric``
    runs it): well_formed is not proven for all sizes, the step that fails has a finite CTI
    beyond DEEP's sizes, and the concrete search at those sizes (seeded by the golden
    traces' states) reaches a violation from the initial state: a real trace, replayed."""
    prefixes = [search.actions_of(tr.load(p)) for p in GOLDEN]
    with seeded_pin_bug():
        r = prove_fact(PEncoding(FAST), "well_formed", timeout_ms=20_000)
        assert r.result == "bounded-only" and r.cti is not None, r
        t, answer, _ = reach(r.cti, 4, prefixes, timeout_ms=600_000, props=props())
        assert t is not None, answer
        assert t["start"] is None and tr.replay(t, props()).reproduced
    assert _beyond_deep(r.cti.sizes), r.cti.sizes
    assert tr.config_of(t) == tr.config_of(r.cti.trace)
    assert not tr.replay(t, props()).reproduced


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
