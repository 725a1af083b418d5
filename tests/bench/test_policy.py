"""The eviction/retention policy and the simulator's (PolicyManager) invariants."""
import random
from itertools import groupby

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.bench.layouts import FULL, V4_MINI, UnknownLayoutError, get_layout
from hybridkv.bench.managers import LRUManager, PolicyManager
from hybridkv.bench.replay import belady_summary, replay
from hybridkv.bench.traces import synthetic_trace
from hybridkv.policy import (EntryMeta, EvictionPolicy, FilteredLRUPolicy, LRUPolicy,
                             PolicyError, SCAN_MIN, ValuePolicy, marconi_checkpoints)
from hybridkv.policy_entries import CompactEntries, DenseCompactEntries
from tests.cache.helpers import UnkeptCounting


def _meta(k, flops=1.0, nbytes=1, tag=""):
    return EntryMeta(k, "block", nbytes, flops, tag)


@pytest.mark.parametrize("cls", [ValuePolicy, FilteredLRUPolicy])
def test_protocol_and_unknown_keys(cls):
    p = cls()
    assert isinstance(p, EvictionPolicy) and isinstance(LRUPolicy(), EvictionPolicy)
    p.admit(_meta("a"))
    with pytest.raises(PolicyError):
        p.admit(_meta("a"))
    for call in (p.access, p.eligible, p.ineligible, p.remove):
        with pytest.raises(PolicyError):
            call("zz")
    assert len(p) == 1 and p.victim() is None      # admitted but never made eligible


def test_value_orders_victims_by_flops_per_byte_and_learned_reuse():
    p = ValuePolicy(flops_weight=1.0)
    p.admit(_meta("cheap", flops=1.0, nbytes=10))
    p.admit(_meta("dear", flops=100.0, nbytes=10))
    p.eligible("cheap"), p.eligible("dear")
    assert p.victim() == "cheap"
    p.ineligible("cheap")
    assert p.victim() == "dear"
    q = ValuePolicy(flops_weight=0.0)
    for i in range(50):                           # "tail" entries are never reused ...
        q.admit(_meta(("t", i), tag="tail"))
        q.admit(_meta(("m", i), tag="mid"))
        q.access(("m", i))                        # ... "mid" ones always are
    assert q.reuse_probability(("block", "tail", 0)) < 0.1
    assert q.reuse_probability(("block", "mid", 0)) > 0.9
    q.admit(_meta("new-mid", tag="mid"))
    q.admit(_meta("new-tail", tag="tail"))
    q.eligible("new-mid"), q.eligible("new-tail")
    assert q.victim() == "new-tail"


def test_lru_policy_is_recency_and_clock_ages():
    p = LRUPolicy()
    for k in "abc":
        p.admit(_meta(k))
        p.eligible(k)
    p.access("a")
    p.eligible("a")
    assert p.victim() == "b"
    p.remove("b")
    assert p.victim() == "c"


def test_filtered_lru_is_exact_lru_without_filtered_classes():
    rng = random.Random(5)
    a, b = FilteredLRUPolicy(learn=False), LRUPolicy()
    live = []
    for step in range(400):
        op = rng.random()
        if op < 0.4 or not live:
            k = step
            for p in (a, b):
                p.admit(_meta(k, tag="mid"))
                p.eligible(k)
            live.append(k)
        elif op < 0.8:
            k = rng.choice(live)
            for p in (a, b):
                p.access(k)
        else:
            v = a.victim()
            assert v == b.victim()
            for p in (a, b):
                p.remove(v)
            live.remove(v)


def test_filtered_lru_sends_rarely_reused_class_first_then_recency():
    p = FilteredLRUPolicy()
    for i in range(60):                   # "mid" entries reused half the time, "tail" never
        p.admit(_meta(("m", i), tag="mid"))
        p.admit(_meta(("t", i), tag="tail"))
        if i % 2:
            p.access(("m", i))
    assert p.filtered(("block", "tail", 0)) and not p.filtered(("block", "mid", 0))
    p.admit(_meta("old-mid", tag="mid"))
    p.admit(_meta("new-tail", tag="tail"))
    p.admit(_meta("new-mid", tag="mid"))
    for k in ("old-mid", "new-tail", "new-mid"):
        p.eligible(k)
    assert p.victim() == "new-tail"      # the filtered tier goes first although it is newer
    p.remove("new-tail")
    assert p.victim() == "old-mid"       # then plain recency
    p.remove("old-mid")
    assert p.victim() == "new-mid"


def test_unkept_blocks_lower_the_filters_mean_as_never_reused_entries_do():
    """A partial last block the runtime never keeps counts as the simulator's never-reused
    tail entry does: the filter's mean over blocks written is the same either way, so the same
    classes are filtered.  Greedy-dual (no population mean) ignores it."""
    kept, told = FilteredLRUPolicy(), FilteredLRUPolicy()
    for i in range(40):                   # "mid" reused 1 in 4; the tails never
        for p in (kept, told):
            p.admit(_meta(("m", i), tag="mid"))
            if i % 4 == 0:
                p.access(("m", i))
        kept.admit(_meta(("t", i), tag="tail"))
        told.unkept()
    assert told.mean_reuse() == kept.mean_reuse() < FilteredLRUPolicy().mean_reuse()
    mid = ("block", "mid", 0)
    assert told.filtered(mid) == kept.filtered(mid)
    alone = FilteredLRUPolicy()           # the same mids without the tails: a higher mean
    for i in range(40):
        alone.admit(_meta(("m", i), tag="mid"))
        if i % 4 == 0:
            alone.access(("m", i))
    assert alone.mean_reuse() > told.mean_reuse()
    v = ValuePolicy()
    v.admit(_meta("a"))
    v.eligible("a")
    before = (dict(v._entered), dict(v._moved), v.clock)
    v.unkept(5)
    assert (dict(v._entered), dict(v._moved), v.clock) == before and v.victim() == "a"


def test_the_simulator_without_partial_blocks_never_caches_one_and_counts_each_as_unkept():
    """PolicyManager(partial_blocks=False) mirrors the runtime, whose chain keys cover whole
    granules only: a request's partial last block is never a node nor a policy entry, and the
    block policy counts it as written (``unkept``)."""
    tr = synthetic_trace(120, seed=3)
    m = PolicyManager(FULL, 60, policy_factory=UnkeptCounting, engine_rule=True,
                      partial_blocks=False)
    partial_keys, expected = set(), 0
    for r in tr.requests:
        keys = tr.keys(r)
        cached_before = set(m.nodes)
        m.serve(tr, r)
        last = len(keys) - 1
        if keys and tr.block_tokens(r, last) < tr.block_size:
            partial_keys.add(keys[last])
            reached = all(k in m.nodes or k in cached_before for k in keys[:last])
            expected += reached and keys[last] not in cached_before
        assert not partial_keys & set(m.nodes)
        assert len(m.blocks) == len(m.nodes)
    assert expected and m.blocks.unkept_calls == [1] * expected
    keep = PolicyManager(FULL, 60, engine_rule=True)        # the default caches them
    for r in tr.requests:
        keep.serve(tr, r)
    assert partial_keys & set(keep.nodes)


def test_marconi_checkpoints():
    assert marconi_checkpoints(10, 3, 9) == (2, 8)   # branch after 3 cached blocks, end
    assert marconi_checkpoints(10, 0, 10) == (9,)     # nothing cached: end only
    assert marconi_checkpoints(4, 4, 4) == (3,)       # fully cached: no branch
    assert marconi_checkpoints(1, 0, 0) == ()         # one partial block: nothing full


@pytest.mark.parametrize("seed", range(6))
def test_policy_manager_invariants(seed):
    rng = random.Random(seed)
    tr = synthetic_trace(200, seed=seed, active=rng.randint(2, 20))
    for layout in (FULL, V4_MINI):
        cap = rng.randint(20, 400)
        m = PolicyManager(layout, cap)
        for r in tr.requests:
            s = m.serve(tr, r)
            assert m.block_used + m.ckpt_used <= cap * layout.block_bytes
            assert m.block_used == len(m.nodes) * layout.block_bytes
            assert len(m.blocks) == len(m.nodes) and not m.pinned
            for k, node in m.nodes.items():          # every cached block's parent is cached
                assert node.parent is None or node.parent in m.nodes
            keys = tr.keys(r)
            assert s.hit_blocks <= len(keys)
            if layout.needs_checkpoint:
                assert s.groups["window+tail"] <= s.groups["compressed"]
                if s.hit_blocks:                     # a hybrid hit needs a checkpoint there
                    assert m.nodes.get(keys[s.hit_blocks - 1]) is None or \
                        keys[s.hit_blocks - 1] in m._ckpt_h


@pytest.mark.parametrize("cap", [150, 800, 5000])
def test_ours_at_least_lru_on_synthetic_multi_turn(cap):
    """At ample capacity (5000 blocks hold the whole trace) ours must tie LRU; below it, where
    the requests' partial last blocks are dead weight for LRU, ours must beat it."""
    tr = synthetic_trace(1500, seed=1)
    for layout in (FULL, V4_MINI):
        ours = replay(tr, PolicyManager(layout, cap), layout)
        lru = replay(tr, LRUManager(layout, cap), layout)
        if cap >= 5000:
            assert ours.hit_rate >= lru.hit_rate
            continue
        assert ours.hit_rate > lru.hit_rate
        assert belady_summary(tr, cap).block_hit_rate >= ours.block_hit_rate
        assert ours.recomputed_tokens == ours.total_tokens - ours.hit_tokens
        assert 0 < ours.flops_saved < ours.flops_total


def test_layout_costs():
    assert FULL.block_bytes == 512 * 8 * 64 * 4 and FULL.checkpoint_bytes(512) == 0
    assert V4_MINI.block_bytes == 150528 and V4_MINI.checkpoint_bytes(512) == 271360
    assert V4_MINI.prefix_flops(4096) < FULL.prefix_flops(4096)
    assert FULL.span_flops(0, 512) < FULL.span_flops(512, 1024)   # attention grows with depth
    with pytest.raises(UnknownLayoutError):
        get_layout("v5")


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["block", "checkpoint"]), st.sampled_from(["", "t"]),
                          st.integers(0, 10 ** 6), st.integers(1, 4096)), max_size=30),
       st.integers(0, 5), st.booleans(), st.sampled_from([0.0, 0.5]))
def test_admit_chain_leaves_what_admit_one_by_one_leaves(specs, used, learn, recency):
    """ValuePolicy.admit_chain, one call per stretch of metas sharing kind, size and tag (as a
    free admits a chain): the entries, priorities and class counts of admitting each meta in
    turn, after some history (accesses and an eviction moved the clock and the class
    counts)."""
    def policy():
        p = ValuePolicy(learn=learn, recency=recency)
        for i in range(used + 1):
            p.admit(EntryMeta(("old", i), "block", 64, 1000.0 * i, ""), float(i))
            p.eligible(("old", i))
            for _ in range(i % 3):
                p.access(("old", i), float(i))
        p.remove(p.victim())
        return p
    metas = [EntryMeta(i, kind, nbytes, float(flops), tag)
             for i, (kind, tag, flops, nbytes) in enumerate(specs)]
    one, run = policy(), policy()
    for m in metas:
        one.admit(m, 7.0)
    for (kind, nbytes, tag), stretch in groupby(metas, lambda m: (m.kind, m.nbytes, m.tag)):
        stretch = list(stretch)
        run.admit_chain([m.key for m in stretch], kind, nbytes, [m.flops for m in stretch],
                        tag, 7.0)
    assert {k: (e.prio, e.uses, e.seq) for k, e in run.entries().items()} == \
        {k: (e.prio, e.uses, e.seq) for k, e in one.entries().items()}
    assert (run._entered, run._moved, run.clock, run._now) == \
        (one._entered, one._moved, one.clock, one._now)


@pytest.mark.parametrize("cls", [ValuePolicy, LRUPolicy, FilteredLRUPolicy])
def test_admit_chain_is_admit_of_each_key_and_refuses_duplicates_whole(cls):
    """admit_chain(keys, kind, nbytes, flops, tag): the entries (with their metas), priorities,
    class counts and sequence numbers that admitting EntryMeta(key, kind, nbytes, f, tag) one by
    one leaves, for ValuePolicy's batched path and the one-by-one fallback of subclasses; a
    duplicate key (in the chain, or already admitted) is refused before anything changes."""
    def policy():
        p = cls()
        p.admit(_meta("old", 5.0, 8), 1.0)
        p.eligible("old")
        p.access("old", 2.0)
        return p
    keys, flops = list(range(40)), [float(16 * i * 3) for i in range(40)]
    one, chain = policy(), policy()
    for k, f in zip(keys, flops):
        one.admit(EntryMeta(k, "block", 4096, f, "comp/x"), 3.0)
    chain.admit_chain(keys, "block", 4096, flops, "comp/x", 3.0)
    assert {k: (e.meta, e.prio, e.uses, e.seq) for k, e in chain.entries().items()} == \
        {k: (e.meta, e.prio, e.uses, e.seq) for k, e in one.entries().items()}
    assert (chain._entered, chain._moved, chain.clock, chain._now, repr(chain._seq)) == \
        (one._entered, one._moved, one.clock, one._now, repr(one._seq))
    if cls is ValuePolicy:
        before = {k: (e.prio, e.seq) for k, e in chain.entries().items()}, dict(chain._entered)
        for bad in ([100, 101, 100], [200, 5]):
            with pytest.raises(PolicyError):
                chain.admit_chain(bad, "block", 4096, [1.0] * len(bad), "comp/x", 4.0)
            assert ({k: (e.prio, e.seq) for k, e in chain.entries().items()},
                    dict(chain._entered)) == before


@settings(max_examples=600, deadline=None)
@given(n=st.integers(1, 48),
       cls=st.sampled_from([ValuePolicy, LRUPolicy, FilteredLRUPolicy]),
       ops=st.lists(st.tuples(st.sampled_from(["access", "eligible", "ineligible", "remove",
                                                "drop", "victim", "run"]),
                              st.integers(0, 47)), max_size=40),
       spaces=st.tuples(st.booleans(), st.booleans()))
def test_compact_chain_entries_answer_every_call_as_entries_admitted_one_by_one(n, cls, ops,
                                                                                spaces):
    """Entries admit_chain keeps compact (``_lazy``) become _Entry objects only when touched:
    every protocol call on them (access, eligible, ineligible, victim, remove evicted or
    not, run_length, remove_run) leaves the clock, entries, victims and answers that the same
    calls leave on entries admitted one by one; for greedy-dual and for the sequence-number
    policies (LRU, FilteredLRU), the counter too.  ``spaces``: which of the two keeps its
    entries as columns over the key space 0..47 (``key_space``) rather than in dicts."""
    keys, flops = list(range(n)), [float((7 * i) % 11 * 4096) for i in range(n)]
    one, chain = cls(), cls()
    for p, dense in zip((one, chain), spaces):
        if dense:
            p.key_space(48)
    for k, f in zip(keys, flops):
        one.admit(EntryMeta(k, "block", 4096, f, "comp"), 1.0)
    chain.admit_chain(keys, "block", 4096, flops, "comp", 1.0)
    assert len(chain._lazy) == n          # kept compact until touched

    def call(p, op, key):
        try:
            if op == "victim":
                return p.victim()
            if op == "run":
                v = p.victim()
                # the most valuable next (short runs), or the least valuable, up to 2 x
                # SCAN_MIN long (run_length then reads the compact priorities as a column)
                sign = -1 if key % 3 else 1
                rest = sorted((k for k in keys if k != v and k in p),
                              key=lambda k: sign * flops[k])
                run = [] if v is None else [v] + rest[:3 if key % 3 else 2 * SCAN_MIN]
                n_run = p.run_length(run, frozenset(run[1:2] if key % 2 else ())) if run else 0
                p.remove_run(run[:n_run])
                return n_run
            if op in ("remove", "drop"):
                return p.remove(key, evicted=op == "remove")
            return getattr(p, op)(key, 2.0) if op == "access" else getattr(p, op)(key)
        except PolicyError as e:
            return ("error", e.value)

    def seen(p):
        return (p.clock, len(p), {k: (e.meta, e.prio, e.uses, e.seq)
                                  for k, e in p.entries().items()}, p.victim(),
                dict(p._entered), dict(p._moved), getattr(p, "_n_in", None))
    for op, i in ops:
        key = keys[i % n] if i < 2 * n else -1
        assert call(chain, op, key) == call(one, op, key), (op, key)
        assert seen(chain) == seen(one), (op, key)
        assert repr(chain._seq) == repr(one._seq)


@pytest.mark.parametrize("n", [20, 64])
def test_filtered_lru_chain_turns_filtered_where_one_by_one_admission_does(n):
    """FilteredLRUPolicy.admit_chain on a class whose learned reuse falls below tau x the
    mean as the chain enters (another class, reused often, keeps the mean up): the entries
    turn filtered (DEAD) at the same one as admitting them one by one, with the same
    priorities and counts -- over histories that put that turn at every place in the
    chain."""
    turns = set()
    for hot in range(10, 200, 3):
        def policy():
            p = FilteredLRUPolicy()
            for i in range(hot):
                p.admit(EntryMeta(("hot", i), "block", 64, 1.0, "hot"), 1.0)
                if i % 3:
                    p.access(("hot", i), 2.0)
            return p
        one, chain = policy(), policy()
        flops = [float(i) for i in range(n)]
        for i, f in enumerate(flops):
            one.admit(EntryMeta(i, "block", 64, f, "cold"), 3.0)
        chain.admit_chain(list(range(n)), "block", 64, flops, "cold", 3.0)
        prios = {k: e.prio for k, e in one.entries().items() if not isinstance(k, tuple)}
        assert {k: e.prio for k, e in chain.entries().items()
                if not isinstance(k, tuple)} == prios, hot
        dead = [k for k in range(n) if prios[k] < 0]
        assert dead == list(range(n - len(dead), n))      # from one entry on: the rest
        turns.add(n - len(dead))
        assert (chain._entered, chain._n_in, repr(chain._seq)) == \
            (one._entered, one._n_in, repr(one._seq))
    assert len(turns) > 2                                 # the turn moves with the history


@settings(max_examples=300, deadline=None)
@given(prios=st.lists(st.integers(0, 6), min_size=1, max_size=40), bound=st.integers(0, 7),
       data=st.data())
def test_dense_below_is_the_key_by_key_scan(prios, bound, data):
    """``DenseCompactEntries.below`` (run_length's column read): the number of leading keys
    whose priority is below the bound, a tie ending it, as run_length's key-by-key loop
    counts; None when a key is not a compact entry (the loop then asks, and raises)."""
    n = len(prios) + 4
    dense = DenseCompactEntries(n)
    keys = data.draw(st.permutations(range(n)))[:len(prios)]
    dense.put_run(np.asarray(keys), [float(q) for q in prios], [0.0] * len(keys), ("b", 1, "t"))
    scan = next((i for i, k in enumerate(keys) if not dense.prio(k) < bound), len(keys))
    assert dense.below(keys, float(bound)) == scan
    others = [k for k in range(n) if k not in keys]
    assert dense.below(keys + others[:1], float(bound)) is None
    assert CompactEntries().below(keys, float(bound)) is None
