"""Eviction sweeps (Evictor._sweep): a make_room that needs several blocks of a pool whose
victims are no chain -- snapshots (window, tail, indexer objects), dead objects waiting, leaves
of different chains -- evicts them as one run (the table once over it) when each victim before
goes quietly, against the block-by-block reference (``runs`` False).

Random prompts under memory pressure (hypothesis) go to two managers in checked mode; after
every call both hold the same state (``test_evict_runs.state``: records, free blocks, index,
every evictor set, the dead queue in order, every policy entry with the victim order, the KV
events).  A fixed stream shows that sweeps happen, in every kind of pool, of dead blocks and
of policy victims.
"""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import eviction
from hybridkv.errors import CacheError
from hybridkv.policy import EntryMeta, LRUPolicy, ValuePolicy
from tests.cache.helpers import commit_all
from tests.cache.test_evict_runs import LAYOUTS, POLICIES, agree, manager, state, victim_order


def serve(m, rid, tokens, free=True):
    """Look up, allocate, commit the whole prompt and (``free``) free it; the outcome."""
    try:
        plan = m.lookup(rid, tokens)
        a = m.allocate(rid, len(tokens) - plan.reuse_tokens)
        commit_all(m, rid, a)
        out = plan.reuse_tokens
    except CacheError as e:
        out = type(e).__name__
    if free and rid in m.requests:
        m.free(rid)
    return out


def prompt(seed, n):
    rnd = random.Random(seed)
    return [rnd.randrange(200) for _ in range(n)]


class Sweeps:
    """Counts the runs ``_drop_sweep`` takes: (kind, dead or policy) -> [run lengths]."""

    def __init__(self, monkeypatch):
        self.seen = {}
        real = eviction.Evictor._drop_sweep

        def spy(ev, pk, run):
            how = "dead" if run[0] in ev.dead[pk] else "policy"
            self.seen.setdefault((pk[0], how), []).append(len(run))
            return real(ev, pk, run)
        monkeypatch.setattr(eviction.Evictor, "_drop_sweep", spy)


def test_a_pressure_stream_sweeps_what_block_by_block_evicts(monkeypatch):
    """40 prompts of 20-200 random tokens through 48 blocks per pool, the indexer version
    bumped twice (stale indexer blocks left to eviction): the sweeping manager and the
    reference agree after every request, and sweeps took runs in every pool kind, from the
    dead queue and from the policy."""
    sweeps = Sweeps(monkeypatch)
    for name in ("v4-mini", "full+swa"):
        run = manager(LAYOUTS[name], POLICIES["value"], runs=True)
        ref = manager(LAYOUTS[name], POLICIES["value"], runs=False)
        rnd = random.Random(0)
        for rid in range(40):
            if rid in (15, 30):         # new indexer weights: old indexer blocks go STALE and
                for m in (run, ref):    # are taken by drop_stale, between READY victims
                    m.bump_indexer_version(sweep=False)
            tokens = prompt(rid, rnd.randrange(20, 200))
            assert serve(run, rid, tokens) == serve(ref, rid, tokens), rid
            assert state(run) == state(ref), rid
        run.check_invariants()
    kinds = {kind for kind, _ in sweeps.seen}
    assert kinds == {"swa", "tail", "idx", "comp"}, sweeps.seen
    assert {how for _, how in sweeps.seen} == {"dead", "policy"}, sweeps.seen
    assert max(max(lengths) for lengths in sweeps.seen.values()) >= 4


calls = st.lists(st.tuples(
    st.sampled_from(("done", "done", "done", "serve", "decode", "free")),
    st.integers(0, 3),                                   # request id
    st.integers(0, 5),                                   # prompt family
    st.integers(10, 180)), min_size=4, max_size=14)


def play(m, op, rid, family, n):
    if op in ("done", "serve"):
        if rid in m.requests:
            m.free(rid)
        return serve(m, rid, prompt(family, 180)[:n // 2] + prompt(1000 + rid, n),
                     free=op == "done")
    try:
        if op == "decode":
            m.allocate(rid, 1)
            m.commit(rid, 1, [rid + 1])
        else:
            m.free(rid)
    except CacheError as e:
        return type(e).__name__
    return None


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("layout", ["v4-mini", "full+swa"])
@settings(max_examples=12, deadline=None)
@given(seq=calls)
def test_sweeps_evict_what_block_by_block_evicts(layout, policy, seq):
    agree(layout, policy, seq, play)


# -- ValuePolicy.victims --------------------------------------------------------------------
def _policy(cls, n):
    p = cls()
    for k in range(n):
        p.admit(EntryMeta(k, "block", 64, float((k * 7) % 5 + 1), "t"), float(k))
        if k % 3:                      # every third entry is never offered
            p.eligible(k)
    for k in range(0, n, 4):           # touched again: a newer record, the old one stale
        if k % 3:
            p.access(k, float(n + k))
            p.eligible(k)
    return p


@pytest.mark.parametrize("cls", [ValuePolicy, LRUPolicy])
@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_victims_are_what_victim_returns_as_each_is_removed(cls, n):
    p, q = _policy(cls, 24), _policy(cls, 24)
    before = {k: (e.prio, e.seq, e.uses) for k, e in p.entries().items()}
    got = p.victims(n)
    assert {k: (e.prio, e.seq, e.uses) for k, e in p.entries().items()} == before
    assert victim_order(p) == victim_order(q) and p.victim() == q.victim()
    want = []
    while len(want) < n and q.victim() is not None:
        want.append(q.victim())
        q.remove(want[-1])
    assert got == want


def test_victims_end_after_the_first_key_go_on_refuses():
    p = _policy(ValuePolicy, 24)
    order = p.victims(30)
    asked = []
    got = p.victims(30, lambda k: asked.append(k) or len(asked) < 3)
    assert got == order[:3] and asked == order[:3]
    assert p.victims(30) == order                    # nothing changed


def test_victims_of_a_policy_with_its_own_remove_is_victim_alone():
    class Counting(ValuePolicy):
        def remove(self, key, evicted=True):        # e.g. a policy that reorders on removal
            super().remove(key, evicted)
    p = Counting()
    for k in range(4):
        p.admit(EntryMeta(k, "block", 64, 1.0, "t"))
        p.eligible(k)
    assert p.victims(4) == [p.victim()]
    assert ValuePolicy().victims(3) == []


def test_victims_drop_the_stale_heap_records_they_pass():
    p = _policy(ValuePolicy, 24)
    live = sum(1 for _, seq, k in p._heap if p.entries()[k].seq == seq)
    p.victims(100)
    heap = p._heap
    assert len(heap) == live
    assert all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap)))   # still a heap


# -- what a sweep relies on -------------------------------------------------------------------
def _pressured(name, n_prompts=30, own=60, cut=None, families=7):
    """A manager after ``n_prompts`` served prompts: a cut (random, or ``cut`` tokens) of one
    of ``families`` shared prefixes, then ``own`` tokens of the request's own."""
    m = manager(LAYOUTS[name], POLICIES["value"], runs=True)
    rnd = random.Random(1)
    for rid in range(n_prompts):
        n = rnd.randrange(0, 120) if cut is None else cut
        tokens = prompt(rid % families, 120)[:n] + prompt(100 + rid, own)
        serve(m, rid, tokens)
    return m


@pytest.mark.parametrize("name,shape", [("v4-mini", (30, 60, None, 7)),
                                        ("full+swa", (30, 60, None, 7)),
                                        ("full", (12, 5, 40, 2))])
def test_a_quiet_drop_reports_nothing_in_its_own_pool(name, shape):
    """PrefixIndex.drops_quietly against unpublish itself: for every published leaf, and for
    the leaves of one parent taken one after another (``gone``), a drop called quiet reports
    no leaf and nothing dead in its own pool; one that is not quiet reports something there or
    has children, or a checkpoint it drops has another object in the pool."""
    import copy
    m = _pressured(name, *shape)
    ix = m.index
    seen = {"quiet": 0, "loud": 0, "loud after a quiet sibling": 0}
    for pk, ents in ix.entries.items():
        by_parent = {}
        for b, e in ents.items():
            if not e.children:
                by_parent.setdefault(None if e.parent is None else e.parent.block, []).append(b)
        for parent, leaves in by_parent.items():
            leaves.sort(key=lambda b: not ix.drops_quietly(pk[0], pk[1], b, {}))  # quiet first
            trial, gone = copy.deepcopy(ix), {}
            for b in leaves:    # siblings one after another, as a sweep takes the quiet ones
                quiet = ix.drops_quietly(pk[0], pk[1], b, gone)
                after = trial if quiet else copy.deepcopy(trial)
                left, dead = after.unpublish(after.refs[pk][b])
                mine = [r for r in [*left, *dead] if (r.kind, r.group) == pk]
                seen["quiet" if quiet else "loud after a quiet sibling" if gone.get(parent)
                     else "loud"] += 1
                if quiet:
                    assert mine == [], (pk, b, mine)
                else:
                    e = ix.entries[pk][b]
                    assert mine or (e.exact or e.anchored) and ix._kills_in(pk, b, e), (pk, b)
    assert seen["quiet"] and seen["loud"] + seen["loud after a quiet sibling"], seen
    if name == "full":           # one-block branches of 2 shared prefixes: sibling leaves
        assert seen["loud after a quiet sibling"], seen


def test_a_dead_block_reachable_again_ends_the_dead_sweep():
    """The dead queue may hold a block that is reachable again (``victim`` skips and forgets
    it when it comes first): a sweep of the dead blocks before it stops there, so both managers
    evict the same blocks in the same order."""
    def staged(runs):
        m = _pressured("v4-mini", 24)
        m.evictor.runs = runs
        pk = ("swa", "csa")
        ev = m.evictor
        reachable = [b for b in ev.cached[pk] if m.index.reachable(m.pools[pk].refs[b])
                     and b not in ev.dead[pk]]
        unreachable = [b for b in ev.cached[pk] if not m.index.reachable(m.pools[pk].refs[b])]
        assert len(reachable) >= 2 and len(unreachable) >= 2, (reachable, unreachable)
        ev.dead[pk].clear()
        for b in (unreachable[0], unreachable[1], reachable[0], reachable[1]):
            ev.dead[pk][b] = None
        return m, pk
    run, pk = staged(True)
    ref, _ = staged(False)
    want = [*run.evictor.dead[pk]][:2]
    for m in (run, ref):
        m.evictor.make_room(pk, m.pools[pk].n_free + 3)
    assert state(run) == state(ref)
    assert not any(b in run.evictor.cached[pk] for b in want)
