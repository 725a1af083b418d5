"""Guard mutation on the parametric tier (``proofs.pmutate``): a mutant re-checks only the
steps of the actions that call its guard, over every fact.

Default tier: one cheap action (``launch``): unmutated, every fact's step over it is proven;
with its TOCTOU re-check dropped, a finite CTI kills the mutant.  Slow tier: the full run."""
import json
import subprocess
import sys

import pytest
import z3

from proofs import trace as tr
from proofs.mutate import applied, find, mutants
from proofs.parametric import props
from proofs.pmutate import MutationRun, mutate_parametric


def _instance(enc, name):
    return next(a for a, ins in enumerate(enc.inst) if ins.name == name)


def test_unmutated_guard_is_proven_on_launch(penc):
    a = _instance(penc, "launch")
    assert "system.can_launch" in penc.calls(a)
    verdicts = {n: penc.prove_step(n, a, 20_000) for n in props()}
    checked = {n: r for n, r in verdicts.items() if r is not None}
    assert "toctou" in checked and "hit_soundness" in checked
    assert all(r == z3.unsat for r in checked.values()), checked


def test_mutant_without_the_toctou_recheck_is_killed_by_a_cti(penc):
    a = _instance(penc, "launch")
    m = find("system.can_launch#1")      # the launch-time re-check of every pinned object
    r = MutationRun(penc, timeout_ms=20_000, budget_s=60).one(m, among=[a])
    assert (r.result, r.how, r.action) == ("killed", "cti", "launch"), r.line()
    assert r.trace["kind"] == "cti" and r.trace["mutant"] == m.as_json()
    with applied(m):
        assert tr.replay(r.trace, props()).reproduced
    # the real guard refuses that very step
    assert not tr.replay(r.trace, props()).all_enabled


def test_mutation_of_a_guard_no_step_calls_is_unused(penc):
    a = _instance(penc, "launch")
    m = find("funnel.can_pad_blocks#0")  # a kernel-launch rule, not part of the system model
    r = MutationRun(penc).one(m, among=[a])
    assert r.result == "unused" and not r.killed


@pytest.mark.slow
def test_full_parametric_mutation_run(penc):
    """All guard mutants: each killed (every kill here is a finite CTI that replays under its
    mutant and not without it), or a survivor with its argument (unused by the model, or
    redundant: every changed step still proven); nothing undecided."""
    res = mutate_parametric(penc, mutants(), timeout_ms=60_000, budget_s=600)
    assert len(res) == len(mutants())
    undecided = [r.line() for r in res if r.result == "undecided"]
    assert not undecided, undecided
    assert all(r.result in ("killed", "redundant", "unused") for r in res)
    for r in res:
        if r.how == "cti":
            with applied(r.mutant):
                assert tr.replay(r.trace, props()).reproduced, r.mutant.name
            assert not tr.replay(r.trace, props()).reproduced, r.mutant.name
    assert sum(r.killed for r in res) > len(res) // 2


@pytest.mark.slow
def test_cli_parametric_mutate_json():
    """``prove --parametric --mutate --json``: the mutation run alone, one JSON object."""
    names = ["system.can_launch#1", "funnel.can_pad_blocks#0"]
    cmd = [sys.executable, "-m", "hybridkv.cli", "prove", "--parametric", "--mutate", "--json"]
    for n in names:
        cmd += ["--mutant", n]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    j = json.loads(out.stdout)
    assert j["parametric"] == []        # the baseline proofs are --no-mutation's run
    m = j["mutations"]
    assert (m["killed"], m["total"]) == (1, 2)
    by = {r["mutant"]: r for r in m["results"]}
    assert by["system.can_launch#1"]["how"] == "cti" and by["system.can_launch#1"]["sizes"]
    assert [s["mutant"] for s in m["survivors"]] == ["funnel.can_pad_blocks#0"]
