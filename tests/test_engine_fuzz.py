"""Stateful end-to-end fuzzing of the engine (hybridkv.engine.fuzz): clean runs pass; seeded
bugs (rejected drafts rolled back in the length only; resuming from a model checkpoint the
HitPlan did not choose) are found."""
import pytest

from hybridkv.engine import fuzz


def test_fuzz_clean_engine_passes():
    r = fuzz.run(8, steps=10, seed=1)
    assert r.examples >= 8 and r.failures == 0 and r.find_seconds == -1.0, r.trace


@pytest.mark.parametrize("bug", ["keep_rejected_drafts", "ignore_plan"])
def test_fuzz_finds_seeded_bug(bug):
    r = fuzz.run(80, bug=bug, steps=12, seed=0, shrink=False)
    assert r.failures == 1 and r.trace and 0 <= r.find_seconds <= r.seconds, r


@pytest.mark.slow
def test_fuzz_shrinks_seeded_draft_leak():
    r = fuzz.run(60, bug="keep_rejected_drafts", steps=12)
    assert r.failures == 1 and "turn" in r.trace, r
