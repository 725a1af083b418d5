"""Deep tier of the Z3 proofs (slow): the sizes of issue 3 (3 objects per kind, 2 requests)
and the full mutation run on the fast configuration.
Run: pytest -m slow tests/test_proofs_deep.py"""
import pytest

from spec import INVARIANTS

from proofs import trace as tr
from proofs.aux import AUX
from proofs.bmc import run_bmc
from proofs.encode import Encoding
from proofs.induction import induction_step
from proofs.mutate import applied
from proofs.run import DEEP, FAST, Settings, prove

pytestmark = pytest.mark.slow


def test_deep_induction():
    enc = Encoding(DEEP)
    res = induction_step(enc, {**INVARIANTS, **AUX}, 1)
    bad = [(r.name, tr.format_trace(r.cti)) for r in res if not r.inductive]
    assert not bad, bad


def test_deep_bmc_no_violation():
    res = run_bmc(Encoding(DEEP), INVARIANTS, 6, aux=AUX)
    assert not [r.name for r in res.invariants if r.violated]
    assert res.reached == 6


def test_full_mutation_run_kills_every_mutant_the_model_can_see():
    rep = prove(FAST, Settings(depth=2))
    survivors = [m for m in rep.mutations if not m.killed]
    unexplained = [m.mutant.name for m in survivors
                   if not m.how.startswith(("unused", "redundant"))]
    assert not unexplained, unexplained
    for m in rep.mutations:
        if m.killed:
            with applied(m.mutant):
                assert tr.replay(m.trace).reproduced, m.mutant.name
            assert not tr.replay(m.trace).reproduced, m.mutant.name
    assert rep.ok
