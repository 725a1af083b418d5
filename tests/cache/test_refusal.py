"""A refused allocation changes nothing (issue 20): admission counts only what eviction can
take (a cached block with a live descendant is *blocked*), so nothing is evicted, spilled or
pinned before the whole allocation is certain to fit; and the admission cap holds with a
disk tier (an allocation's blocks are reserved while eviction spills)."""
import random

import pytest

from hybridkv.cache import CacheManager
from hybridkv.disk import DiskTier
from hybridkv.errors import AdmissionRefused, InvariantViolation
from tests.cache.helpers import LAY, commit_all, fingerprint
from tests.cache.seeded import old_counting, unreserved_spills

P = [(7 * i + 3) % 250 for i in range(96)]
Q = [(11 * i + 5) % 250 for i in range(80)]


def recomputed_behind_a_publisher(n=11):
    """A looks up cold; B computes a prefix of A's prompt and frees (its blocks cached); A
    then computes its whole prompt: its chain blocks past B's hang off B's cached blocks."""
    m = CacheManager(LAY, num_blocks=n, checked=True)
    m.lookup("A", P[:80])
    m.lookup("B", P[:40])
    commit_all(m, "B", m.allocate("B", 40))
    m.free("B")
    commit_all(m, "A", m.allocate("A", 80))
    return m


def observe(m):
    """What a refusal must leave identical: the state, stats, bytes held, other lookups."""
    stats = {k: v for k, v in m.stats().items() if k not in ("hit", "partial", "miss")}
    state = fingerprint(m)
    plans = []
    for i, toks in enumerate((P[:40], P[:80], P[:90], Q[:40])):
        plan = m.lookup(f"peek{i}", toks)
        m.free(f"peek{i}")
        plans.append((plan.reuse_tokens, plan.group_hits))
    return state, stats, m.kv_bytes_held(), plans


def test_a_cached_block_with_a_live_descendant_is_blocked_not_available():
    m = recomputed_behind_a_publisher()
    ev = m.evictor
    blocked = {pk: set(s) for pk, s in ev.liveness.blocked.items() if s}
    assert blocked, "B's cached chain blocks carry A's live chain: blocked"
    for pk, bs in blocked.items():
        assert bs <= ev.cached[pk]
        assert ev.available(pk) == m.pools[pk].n_free + len(ev.cached[pk]) - len(bs)
    m.free("A")                                     # A's chain cached: nothing blocked now
    assert not any(ev.liveness.blocked.values())
    m.check_invariants()


def test_refused_first_allocation_changes_nothing_and_the_retry_works():
    m = recomputed_behind_a_publisher()
    m.lookup("C", Q[:24])
    before = observe(m)
    with pytest.raises(AdmissionRefused) as e:
        m.allocate("C", 24)
    assert e.value.value                                  # names the short pool
    assert observe(m) == before
    with pytest.raises(AdmissionRefused):                 # the same refusal, no AttributeError
        m.allocate("C", 24)
    assert observe(m) == before
    m.free("A")
    a = m.allocate("C", 24)                                # room once A's chain is cached
    commit_all(m, "C", a)
    m.free("C")
    m.check_invariants()


def test_seeded_old_counting_evicts_before_refusing(monkeypatch):
    """Negative control: with the old count the same call evicts first, then refuses."""
    old_counting(monkeypatch)
    m = recomputed_behind_a_publisher()
    m.checked = False
    m.lookup("C", Q[:24])
    before = fingerprint(m)
    with pytest.raises(AdmissionRefused):
        m.allocate("C", 24)
    assert fingerprint(m) != before


def pressure_with_disk(tmp_path, cap, n_requests=60, seed=0):
    """Prompts sharing prefixes through a checked manager with a disk tier (spills on
    eviction) under a tight admission cap; returns the manager's disk counters."""
    rng = random.Random(seed)
    tier = DiskTier(tmp_path, capacity_bytes=1 << 26, max_in_flight=64)
    m = CacheManager(LAY, num_blocks=16, checked=True, check_every=1, disk=tier, cap=cap)
    base = [rng.randrange(250) for _ in range(200)]
    try:
        for i in range(n_requests):
            toks = base[:rng.randrange(8, 120)] + \
                [rng.randrange(250) for _ in range(rng.randrange(0, 40))]
            p = m.lookup(f"r{i}", toks)
            try:
                commit_all(m, f"r{i}", m.allocate(f"r{i}", len(toks) - p.reuse_tokens))
            except AdmissionRefused:
                pass
            m.free(f"r{i}")
        return dict(m.disk_link.counts)
    finally:
        tier.close()


def test_admission_cap_holds_with_a_disk_tier(tmp_path):
    counts = pressure_with_disk(tmp_path, cap=64)
    assert counts.get("spill_started", 0) > 0          # evictions did spill
    assert counts.get("spill_skipped", 0) > 0          # and some spills had to wait for room


def test_seeded_unreserved_spills_break_the_cap(tmp_path, monkeypatch):
    """Negative control: spills started while making room, not counted beside the
    allocation's blocks (the old order), push transit past the cap: checked mode sees it."""
    unreserved_spills(monkeypatch)
    with pytest.raises(InvariantViolation, match="admission_cap"):
        pressure_with_disk(tmp_path, cap=64)
