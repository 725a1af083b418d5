"""Stateful end-to-end fuzzing of the engine (hybridkv.engine.fuzz): clean runs pass and report
per-rule counts; seeded bugs (hybridkv.engine.bugs) are found as clean assertions (an output
mismatch against the cold run, or a draft-isolation invariant), not as crashes."""
import pytest

from hybridkv.engine import fuzz


def test_fuzz_clean_engine_passes_and_counts_rules():
    r = fuzz.run(4, steps=8, seed=1)
    assert r.examples >= 4 and r.failures == 0 and r.find_seconds == -1.0, r.trace
    assert r.rules.get("turn", 0) + r.rules.get("follow_up", 0) > 0
    assert all(0 < v <= r.examples for v in r.rules.values()), r.rules


def test_fuzz_finds_published_drafts_as_an_invariant_failure():
    r = fuzz.run(60, bug="publish_drafts", steps=10, seed=1, shrink=False)
    assert r.failures == 1 and 0 <= r.find_seconds <= r.seconds, r
    assert r.error.startswith("AssertionError: draft isolation"), r.error


@pytest.mark.slow
@pytest.mark.parametrize("bug,msg", [("ignore_plan", "AssertionError: output mismatch"),
                                     ("keep_rejected_drafts", "")])
def test_fuzz_finds_seeded_bug(bug, msg):
    r = fuzz.run(80, bug=bug, steps=12, seed=0, shrink=False)
    assert r.failures == 1 and r.trace and 0 <= r.find_seconds <= r.seconds, r
    assert r.error.startswith(msg), r.error


@pytest.mark.slow
def test_fuzz_shrinks_published_drafts():
    r = fuzz.run(60, bug="publish_drafts", steps=12, seed=0)
    assert r.failures == 1 and "state.turn(" in r.trace and "draft isolation" in r.trace, r
