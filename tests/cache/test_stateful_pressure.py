"""Hypothesis stateful test on tiny pools (4-16 blocks): many repeated and overlapping prompts,
chunked prefills with checkpoints (forks on or off), decodes, drafts, refusals, frees, indexer
bumps.  After every rule the accounting invariant holds (check_invariants: every non-free block
is held by a live request, cached (evictable) or loading); whenever no request is live,
capacity is intact: every block is free or evictable."""
import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused, StaleRead
from tests.cache.helpers import LAY

BASES = [[(7 * i + 3) % 250 for i in range(48)], [(11 * i + 5) % 250 for i in range(48)]]


class Pressure(RuleBasedStateMachine):
    @initialize(blocks=st.integers(4, 16), every=st.sampled_from([0, 8, 16]),
                forks=st.booleans())
    def setup(self, blocks, every, forks):
        self.m = CacheManager(LAY, num_blocks=blocks, every_n=every, checked=True,
                              check_every=8, forks=forks)
        self.live = {}          # rid -> tokens committed so far
        self.n = 0

    def _serve(self, rid, toks, chunk):
        m = self.m
        plan = m.lookup(rid, toks)
        L = plan.reuse_tokens
        try:
            while L < len(toks):
                a = m.allocate(rid, min(chunk - L % chunk, len(toks) - L))
                for P in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
                    m.commit(rid, P - L)
                    L = P
        except (AdmissionRefused, StaleRead):
            m.free(rid)
            return False
        self.live[rid] = list(toks)
        return True

    @rule(base=st.integers(0, 1), cut=st.integers(1, 48), extra=st.lists(
        st.integers(0, 249), max_size=6), chunk=st.sampled_from([4, 8, 64]))
    def start(self, base, cut, extra, chunk):
        if len(self.live) >= 3:
            return
        self.n += 1
        self._serve(f"r{self.n}", BASES[base][:cut] + extra, chunk)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10), toks=st.lists(st.integers(0, 249), min_size=1, max_size=3),
          drafts=st.integers(0, 3), accept=st.integers(0, 3))
    def decode(self, pick, toks, drafts, accept):
        rid = sorted(self.live)[pick % len(self.live)]
        m = self.m
        try:
            for t in toks:
                m.allocate(rid, 1, num_draft_tokens=drafts)
                m.commit(rid, 1, [t])
                self.live[rid].append(t)
                if drafts:
                    d = [(t + j) % 250 for j in range(drafts)]
                    if accept >= drafts:
                        m.accept_drafts(rid, d)
                        self.live[rid] += d
                    else:
                        m.reject_drafts(rid)
        except AdmissionRefused:
            pass

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10))
    def free(self, pick):
        rid = sorted(self.live)[pick % len(self.live)]
        self.m.free(rid)
        del self.live[rid]

    @rule()
    def bump(self):
        if not self.live:
            self.m.bump_indexer_version()

    @invariant()
    def accounting(self):
        if not hasattr(self, "m"):
            return
        self.m.check_invariants()
        if not self.live:
            for name, p in self.m.stats()["pools"].items():
                assert p["free"] + p["evictable"] == p["blocks"], (name, p)


TestPressure = Pressure.TestCase
TestPressure.settings = settings(max_examples=60, stateful_step_count=25, deadline=None,
                                 suppress_health_check=list(HealthCheck))


@pytest.mark.slow
def test_pressure_deep():
    run_state_machine_as_test(Pressure, settings=settings(
        max_examples=1000, stateful_step_count=40, deadline=None,
        suppress_health_check=list(HealthCheck)))


def test_a_seeded_leak_is_found(monkeypatch):
    """Negative control: superseded snapshots neither dropped nor made evictable (the leak of
    issue 14) -- the machine fails on the accounting invariant."""
    from hybridkv.cache.snapshots import Snapshots

    def leaky_release(self, req, P):
        req.snapshots.pop(P, None)
        req.snapshot_tags.pop(P, None)
        req.sealed_points.remove(P)
    monkeypatch.setattr(Snapshots, "release", leaky_release)
    with pytest.raises(Exception) as e:
        run_state_machine_as_test(Pressure, settings=settings(
            max_examples=60, stateful_step_count=25, deadline=None, database=None,
            suppress_health_check=list(HealthCheck), derandomize=True,
            phases=[Phase.generate], report_multiple_bugs=False))
    assert "accounting" in str(e.value) or "evictable" in str(e.value), e.value
