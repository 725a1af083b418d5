"""Dense retention (``every_n`` at the hash granule: a snapshot at every block end, as the
vLLM adapter keeps vLLM's every window block): an allocation publishes its points' snapshot
objects as one run per pool (ObjectWriter.publish_run), and a chunk's one commit passes the
window-only points and captures them together.  Random call sequences under memory pressure
go to two managers in checked mode, one batching (``Evictor.runs``) and one object by object
(``runs`` False); after every call both hold the same state (tests/cache/test_evict_runs.state:
records, index, every evictor set, the policy's entries and victim order, KV events in order,
arena pages).
"""
import pytest
from hypothesis import given, settings

from hybridkv.cache import CacheManager
from hybridkv.cache.pool import Pool
from tests.cache.test_evict_runs import LAYOUTS, POLICIES, calls, play, state

SIZES = {"full+swa": dict(num_blocks=48), "v4-mini": dict(num_blocks=48),
         "full+swa arena": dict(num_pages=64)}


def manager(name, policy, runs):
    layout = LAYOUTS[name.split()[0]]
    m = CacheManager(layout, device="meta", checked=True, events=True, every_n=layout.granule,
                     policy_factory=POLICIES[policy], **SIZES[name])
    m.evictor.runs = runs
    return m


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", sorted(SIZES))
@settings(max_examples=10, deadline=None)
@given(seq=calls)
def test_dense_runs_leave_what_object_by_object_leaves(name, policy, seq):
    ref, run = manager(name, policy, runs=False), manager(name, policy, runs=True)
    for call in seq:
        assert play(run, *call, chunked=True) == play(ref, *call, chunked=True), call
        assert state(run) == state(ref), call
    run.check_invariants()
    ref.check_invariants()


def test_an_allocation_publishes_its_snapshots_as_one_run(monkeypatch):
    """A 40-token prompt at 4-token granules: its window snapshots fire ``publish`` as one
    run, and each is filed in the index."""
    m = manager("full+swa", "value", runs=True)
    fired = []
    fire_run = Pool.fire_run
    monkeypatch.setattr(Pool, "fire_run", lambda self, blocks, event, *args: (
        fired.append((self.kind, event, list(blocks))), fire_run(self, blocks, event, *args))[1])
    assert play(m, "serve", 0, 0, 40, 0, chunked=True) == 0
    runs = [blocks for kind, event, blocks in fired if kind == "swa" and event == "publish"]
    assert runs and max(map(len, runs)) >= 2
    swa = next(pk for pk in m.pools if pk[0] == "swa")
    assert all(m.index.published(*swa, b) for b in runs[0])
    m.check_invariants()
