"""Stateful end-to-end fuzzing of the engine (hybridkv.testing.fuzz): clean runs pass and report
per-rule counts; seeded bugs (hybridkv.testing.bugs) are found as clean assertions (an output
mismatch against the cold run, or draft isolation), not as crashes."""
import pytest

import hybridkv as hk
from hybridkv.testing import bugs, fuzz, fuzzcheck


def test_fuzz_clean_engine_passes_and_counts_rules():
    r = fuzz.run(3, steps=6, seed=1)
    assert r.examples >= 3 and r.failures == 0 and r.find_seconds == -1.0, r.trace
    assert r.rules.get("turn", 0) + r.rules.get("follow_up", 0) > 0
    assert all(0 < v <= r.examples for v in r.rules.values()), r.rules


def test_published_drafts_break_draft_isolation():
    """The publish_drafts engine on a repetitive prompt: the check the fuzzer runs after every
    rule says draft isolation, not a crash."""
    m = hk.V4Mini(seed=0)
    with bugs.seeded("publish_drafts") as cls:
        eng = cls(m, hk.CacheManager(m.layout(), num_blocks=64), num_draft_tokens=3)
        outs = eng.generate([[5, 6, 7, 8] * 6, [(7 * i + 3) % 250 for i in range(30)] * 2], 16)
    legit = fuzzcheck.committed_keys(eng.cache.layout, eng.last_outputs)
    assert sum(o.drafted - o.accepted for o in eng.last_outputs) > 0
    with pytest.raises(AssertionError, match="draft isolation"):
        fuzzcheck.check_state(eng.cache, legit)
    fuzzcheck.check_outputs(m, eng.last_outputs)          # the outputs themselves are right
    assert outs


@pytest.mark.slow
@pytest.mark.parametrize("bug,msg", [("publish_drafts", "AssertionError: draft isolation"),
                                     ("resume_off_plan", "AssertionError: output mismatch")])
def test_fuzz_finds_seeded_bug(bug, msg):
    r = fuzz.run(80, bug=bug, steps=12, seed=0, shrink=False)
    assert r.failures == 1 and r.trace and 0 <= r.find_seconds <= r.seconds, r
    assert r.error.startswith(msg), r.error


@pytest.mark.slow
def test_fuzz_long_clean_run():
    r = fuzz.run(30, steps=12, seed=3)
    assert r.failures == 0, r.trace
