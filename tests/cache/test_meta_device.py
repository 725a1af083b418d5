"""A manager on the meta device (bookkeeping only: an engine whose bytes live elsewhere, the
vLLM adapter) moves no bytes, and reaches what the same manager with real tensors reaches:
the same states, hits, copies handed to a worker, and bytes counted as captured and restored
(snapshot rows copied in ring order included)."""
import pytest
from hypothesis import given, settings

from hybridkv.cache import CacheManager
from hybridkv.policy import ValuePolicy
from tests.cache.test_evict_runs import LAYOUTS, calls, play, state


def manager(layout, device):
    return CacheManager(layout, device=device, checked=True, events=True,
                        policy_factory=ValuePolicy, num_blocks=48)


def moved(m):
    return m.snapshots.captured_bytes, m.writer.restored_bytes, list(m.snapshots.copies)


@pytest.mark.parametrize("layout", ["v4-mini", "full+swa"])
@settings(max_examples=10, deadline=None)
@given(seq=calls)
def test_the_meta_device_counts_what_real_tensors_move(layout, seq):
    real, meta = manager(LAYOUTS[layout], "cpu"), manager(LAYOUTS[layout], "meta")
    assert real.pools[next(iter(real.pools))].holds_bytes
    assert not any(p.holds_bytes for p in meta.pools.values())
    for call in seq:
        assert play(meta, *call) == play(real, *call), call
        assert moved(meta) == moved(real), call
        assert state(meta) == state(real), call
