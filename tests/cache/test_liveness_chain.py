"""Liveness.settle_chain's set-by-set path for a cached chain run (a free's chain) against
the block-by-block walk, on random prefix trees: the same live, live-children and blocked
state, and a sound recount (Liveness.check).

The trees and cached states are random: a freed chain's ancestors often have other live
branches (the run stops dying part way: the blocks from there up stay live and become
blocked), sometimes none (the top's parent loses a live child and settles on up)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import liveness as liveness_mod
from hybridkv.cache import CacheManager
from hybridkv.cache.liveness import Liveness
from hybridkv.cache.pool import ObjRef
from hybridkv.layout import ModelLayout

LAYOUT = ModelLayout.full(block_size=4)
PK = LAYOUT.pool_keys()[0]


@st.composite
def trees(draw):
    """Parents (block -> earlier block or None), cached blocks, and the chain to free: the
    path up from a block, deepest first, all uncached until the free caches them."""
    n = draw(st.integers(10, 40))
    parents = [None] + [draw(st.one_of(st.none(), st.integers(0, b - 1)))
                        if draw(st.integers(0, 9)) == 0 else draw(st.integers(max(0, b - 3), b - 1))
                        for b in range(1, n)]
    tip = draw(st.integers(0, n - 1))
    path = [tip]
    while parents[path[-1]] is not None:
        path.append(parents[path[-1]])
    length = draw(st.integers(1, len(path)))
    run = path[:length]
    others = [b for b in range(n) if b not in run]
    cached = draw(st.lists(st.sampled_from(others), unique=True)) if others else []
    return parents, cached, run


def settled(parents, cached_now, run, fast):
    """A Liveness over a manager's real PrefixIndex (published into directly): every block
    published (settled as it enters), ``cached_now`` cached and settled one by one, then
    ``run`` cached and given to settle_chain at once (``fast``: the chain path allowed)."""
    m = CacheManager(LAYOUT, device="meta", num_blocks=len(parents))
    index, cached = m.index, {PK: set()}
    lv = Liveness({PK: m.pools[PK]}, index, cached)
    for b, p in enumerate(parents):
        index.publish(ObjRef(PK[0], PK[1], b), b"k%d" % b, False,
                      None if p is None else ObjRef(PK[0], PK[1], p))
        lv.settle(PK, b)
    for b in cached_now:
        cached[PK].add(b)
        lv.settle(PK, b)
    assert lv.check(PK) == []
    cached[PK].update(run)
    old = liveness_mod.CHAIN_RUN_MIN
    liveness_mod.CHAIN_RUN_MIN = 1 if fast else 10 ** 9
    try:
        lv.settle_chain(PK, run)
    finally:
        liveness_mod.CHAIN_RUN_MIN = old
    return lv


@settings(max_examples=300, deadline=None)
@given(trees())
def test_a_cached_chain_settles_set_by_set_as_block_by_block(tree):
    parents, cached, run = tree
    fast, walk = settled(parents, cached, run, True), settled(parents, cached, run, False)
    assert fast.check(PK) == []
    assert fast.live[PK] == walk.live[PK]
    assert fast.blocked[PK] == walk.blocked[PK]
    assert {b: n for b, n in fast.below[PK].items() if n} == \
        {b: n for b, n in walk.below[PK].items() if n}


def test_a_run_stopping_part_way_keeps_the_blocks_above_live_and_blocked():
    """0 <- 1 <- 2 <- 3 and 1 <- 4 (4 uncached): freeing 3, 2, 1 kills 3 and 2 only; 1 and 0
    stay live (4 lives below them) and become blocked."""
    parents = [None, 0, 1, 2, 1]
    lv = settled(parents, [], [3, 2, 1], True)
    assert lv.live[PK] == {0, 1, 4}
    assert lv.blocked[PK] == {1}
    assert lv.below[PK][1] == 1 and lv.below[PK][2] == 0
    assert lv.check(PK) == []


@settings(max_examples=200, deadline=None)
@given(trees(), st.data())
def test_chain_of_is_each_block_parented_by_the_next_given(tree, data):
    """Liveness.chain_of(pk, blocks) (a caller's proof that blocks form a published chain
    given deepest first, which lets settle_chain and Evictor._place_run skip their own checks)
    is exactly: every block published and each one's parent the next block given -- for a
    list or a tuple; a reordered or gapped run, or one naming an unpublished block, is not."""
    parents, cached, run = tree
    m = CacheManager(LAYOUT, device="meta", num_blocks=len(parents) + 1)
    lv = Liveness({PK: m.pools[PK]}, m.index, {PK: set()})
    for b, p in enumerate(parents):
        m.index.publish(ObjRef(PK[0], PK[1], b), b"k%d" % b, False,
                        None if p is None else ObjRef(PK[0], PK[1], p))
    blocks = data.draw(st.one_of(st.just(run), st.permutations(run),
                                 st.lists(st.integers(0, len(parents)), min_size=1,
                                          max_size=6)))
    truth = all(b < len(parents) for b in blocks) and \
        all(parents[b] == up for b, up in zip(blocks, blocks[1:]))
    assert lv.chain_of(PK, list(blocks)) == truth
    assert lv.chain_of(PK, tuple(blocks)) == truth
    assert lv.chain_of(PK, run)                 # the path up, deepest first
