"""Block ends recorded by their chain blocks (PrefixIndex.ends_pool) against filed Checkpoint
records (the layout's rule alone: one chain pool, nothing exact at block ends).

On a full-attention layout a checkpoint at a block end is the chain blocks alone, so the index
files no Checkpoint per block: the chain map is the record.  Random call sequences under memory
pressure go to two managers in checked mode, one as shipped and one filing a record per block
end (``_ends_pool`` answering None); after every call both hold the same state: hits, pool
records and free lists, index entries (the anchors less the block ends' own keys), the
checkpoints (filed vs filed + block ends), every Evictor set, the dead in order, the policy
entries, the events.
"""
import pytest
from hypothesis import given, settings

import hybridkv.cache.index as index_module
from hybridkv.cache import CacheManager
from hybridkv.layout import ModelLayout
from hybridkv.policy import FilteredLRUPolicy, ValuePolicy
from tests.cache.helpers import LAY
from tests.cache.test_evict_runs import calls, play, victim_order

FULL = ModelLayout.full(block_size=4)
POLICIES = {"value": ValuePolicy, "filtered": FilteredLRUPolicy}


def manager(policy, filed, monkeypatch):
    with monkeypatch.context() as mp:
        if filed:
            mp.setattr(index_module, "_ends_pool", lambda layout: None)
        return CacheManager(FULL, device="meta", checked=True, events=True,
                            policy_factory=policy, num_blocks=48)


def state(m):
    ev, ix, lv = m.evictor, m.index, m.evictor.liveness
    ends = set(ix.ends or ())
    pools = {pk: (tuple(p.recs), p.n_free, sorted({b for b in p.free if p.is_free[b]}))
             for pk, p in m.pools.items()}
    index = ({pk: {b: (e.key, e.exact, e.parent, frozenset(e.children),
                       frozenset(e.anchored) - {e.key}) for b, e in ents.items()}
              for pk, ents in ix.entries.items()},
             dict(ix.chain), dict(ix.exact), set(ix.ckpts) | ends, ix.num_checkpoints())
    sets = {pk: (set(ev.admitted[pk]), set(ev.cached[pk]), set(ev.eligible[pk]),
                 list(ev.dead[pk]), set(lv.live[pk]),
                 {b: n for b, n in lv.below[pk].items() if n}, set(lv.blocked[pk]))
            for pk in m.pools}
    policies = {pk: (p.clock, repr(p._seq), {k: (e.prio, e.uses, e.seq)
                                             for k, e in p.entries().items()}, victim_order(p))
                for pk, p in ev.policies.items()}
    return pools, index, sets, policies, list(m.events)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=30, deadline=None)
@given(seq=calls)
def test_block_ends_recorded_by_their_blocks_reach_what_filed_records_reach(policy, seq):
    with pytest.MonkeyPatch.context() as mp:
        ours = manager(POLICIES[policy], False, mp)
        filed = manager(POLICIES[policy], True, mp)
    assert ours.index.ends_pool == ("comp", "full") and filed.index.ends_pool is None
    for call in seq:
        assert play(ours, *call) == play(filed, *call), call
        assert state(ours) == state(filed), call
        assert not ours.index.ckpts, "a block end filed a Checkpoint"
    ours.check_invariants()
    filed.check_invariants()


# A's chain cached, B hits part of it and extends it, both freed, then C's allocation evicts:
# leaves go first, their parents become leaves (never dead: each still records its own end).
CHAIN = [("done", 0, 0, 60, 0), ("done", 1, 0, 40, 20), ("done", 2, 1, 90, 0),
         ("done", 3, 2, 100, 0), ("serve", 4, 0, 48, 4)]


def test_a_block_that_lost_its_children_is_still_a_resume_point(monkeypatch):
    ours = manager(ValuePolicy, False, monkeypatch)
    filed = manager(ValuePolicy, True, monkeypatch)
    for call in CHAIN:
        assert play(ours, *call) == play(filed, *call), call
        assert state(ours) == state(filed), call
    assert ours.metrics.evictions, "C evicted"
    assert ours.stats()["checkpoints"] == len(ours.index.chain[("comp", "full")]) > 0
    hit = play(ours, "serve", 5, 2, 100, 4)                # D's chain, its parents still hit
    assert hit == play(filed, "serve", 5, 2, 100, 4) >= 64, hit


def test_a_seeded_dead_rule_without_the_block_ends_is_caught(monkeypatch):
    """Seeded: the index answers block ends from the chain map but its dead test forgets
    them (``ends_pool`` None): a parent that loses its last child is reported dead, so
    eviction takes it before the policy's choice, and the states part."""
    ours = manager(ValuePolicy, False, monkeypatch)
    filed = manager(ValuePolicy, True, monkeypatch)
    ours.index.ends_pool = None
    parted = False
    for call in CHAIN:
        play(ours, *call)
        play(filed, *call)
        parted |= state(ours) != state(filed)
    assert parted


def test_layouts_with_snapshots_at_block_ends_file_their_records():
    for layout in (ModelLayout.full(block_size=4, window=8), LAY):
        m = CacheManager(layout, device="meta", num_blocks=48)
        assert m.index.ends_pool is None and m.index.ends is None
