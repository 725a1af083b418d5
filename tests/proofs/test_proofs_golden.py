"""Golden counterexample traces of the mutation run (tests/golden/*.json), replayed forever:
under the mutant each trace names, the spec's step must reproduce the violation; without the
mutant, no invariant may break along the part of the trace that is still enabled."""
import pathlib

import pytest

from spec import INVARIANTS, step

from proofs import trace as tr
from proofs.mutate import Mutant, applied

GOLDEN = sorted((pathlib.Path(__file__).parents[1] / "golden").glob("*.json"))


def test_golden_traces_exist():
    assert GOLDEN, "no golden traces committed"


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_trace_reproduces_under_its_mutant(path):
    t = tr.load(path)
    assert t["mutant"], "a golden trace names its mutant"
    with applied(Mutant(**t["mutant"])):
        r = tr.replay(t)
    assert r.all_enabled, f"step {r.first_disabled} no longer enabled under the mutant"
    assert r.reproduced, f"{t['invariant']} not violated; violated: {r.violated}"


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_trace_is_harmless_without_mutant(path):
    t = tr.load(path)
    c = tr.config_of(t)
    s = tr._start_state(t, c)
    for n, rec in enumerate(t["steps"]):
        en, s = step(s, c, rec["action"], tr._args(rec))
        if not en:
            return      # the real guard refuses this step: the trace stops here
        bad = [name for name, inv in INVARIANTS.items() if not inv(s, c)]
        assert not bad, f"unmutated spec breaks {bad} after step {n + 1}"
