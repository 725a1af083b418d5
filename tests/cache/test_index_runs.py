"""PrefixIndex's run calls against their one-block definitions, on random prefix trees with
checkpoints hanging from random blocks and exact objects among the leaves:

- ``unpublish_run(blocks)`` (a path up the tree, deepest first) leaves the index exactly as
  ``unpublish`` of each block in order does, and reports what those calls report together
  less the run's own blocks.  Runs whose every block but the top one is a plain chain block
  take the set-at-once path (``_lone_chain``); the rest the loop.
- ``lone_ancestors(b, limit)`` is the walk up from b while each parent has b's side as its only
  child, at most ``limit`` steps."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import CacheManager
from hybridkv.cache.pool import ObjRef
from hybridkv.layout import ModelLayout

LAYOUT = ModelLayout.full(block_size=4)
PK = LAYOUT.pool_keys()[0]


def ref(b):
    return ObjRef(PK[0], PK[1], b)


@st.composite
def forests(draw):
    """Parents (block -> an earlier block or None; mostly the block just before, so long
    chains), checkpoints (anchor block, H) and exact leaves, and a run: the path up from a
    random block, deepest first (its first block may have children outside it)."""
    n = draw(st.integers(4, 40))
    parents = [None] + [draw(st.one_of(st.none(), st.integers(0, b - 1)))
                        if draw(st.integers(0, 7)) == 0 else b - 1 for b in range(1, n)]
    anchored = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=4))
    exact = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=3))
    tip = draw(st.integers(0, n - 1))
    path = [tip]
    while parents[path[-1]] is not None:
        path.append(parents[path[-1]])
    run = path[:draw(st.integers(1, len(path)))]
    return parents, anchored, exact, run


def built(parents, anchored, exact):
    """A manager's real PrefixIndex, published into directly: block b under key k<b> (exact
    ones under the key of a checkpoint anchored at their parent when there is one), each
    anchored block the one anchor of a checkpoint at 4 * (b + 1) + 1 (no block end)."""
    m = CacheManager(LAYOUT, device="meta", num_blocks=len(parents))
    index = m.index
    for b, p in enumerate(parents):
        if b in exact:
            continue
        assert index.publish(ref(b), b"k%d" % b, False, None if p is None else ref(p))
    for b in anchored:
        if b not in exact:
            assert index.add_checkpoint(4 * (b + 1) + 1, b"c%d" % b, [ref(b)])
    for b in exact:
        p = parents[b]
        key = b"c%d" % p if p is not None and p in anchored and p not in exact else b"x%d" % b
        index.publish(ref(b), key, True, None if p is None else ref(p))
    return index


def state(index):
    ents = index.entries[PK]
    return ({b: (e.key, e.exact, None if e.parent is None else e.parent.block,
                 sorted(e.children), sorted(e.anchored)) for b, e in ents.items()},
            dict(index.chain[PK]), dict(index.exact[PK]), dict(index.ckpts))


@settings(max_examples=400, deadline=None)
@given(forests())
def test_unpublish_run_is_unpublish_block_by_block(forest):
    parents, anchored, exact, run = forest
    index_run, index_one = built(parents, anchored, exact), built(parents, anchored, exact)
    run = [b for b in run if b in index_one.entries[PK]]
    if not run or any(parents[a] != b for a, b in zip(run, run[1:])):
        return                                  # (an exact block in the path: no chain run)
    leaves, dead = index_run.unpublish_run(PK[0], PK[1], run)
    want_leaves, want_dead = [], []
    for b in run:
        lv, dd = index_one.unpublish(ref(b))
        want_leaves += lv
        want_dead += dd
    assert state(index_run) == state(index_one)
    assert leaves == [p for p in want_leaves if p.block not in run]
    assert dead == [d for d in want_dead if d.block not in run]


def test_a_plain_chain_run_takes_the_set_at_once_path():
    """0 <- 1 <- ... <- 9: the run 9 .. 3 is a lone chain, so all but its top go at once, and
    the top's parent (2) is left a leaf; a run whose first block has a child outside it, or
    with a checkpoint hanging from a block below the top, is not a lone chain."""
    parents = [None, *range(9)]
    index = built(parents, [], [])
    run = list(range(9, 2, -1))
    assert index._lone_chain(PK, run, set(run)) == [index.entries[PK][b] for b in run[:-1]]
    assert index._lone_chain(PK, run[1:], set(run[1:])) is None     # 8 keeps child 9
    leaves, dead = index.unpublish_run(PK[0], PK[1], run)
    assert leaves == [ref(2)] and dead == []
    assert sorted(index.entries[PK]) == [0, 1, 2] and index.entries[PK][2].children == ()
    assert sorted(index.chain[PK].values()) == [0, 1, 2]
    anchored = built(parents, [5], [])
    assert anchored._lone_chain(PK, run, set(run)) is None


@settings(max_examples=300, deadline=None)
@given(forests(), st.integers(0, 45))
def test_lone_ancestors_walks_up_while_each_parent_has_one_child(forest, limit):
    """Without checkpoints: from b, each next block is the last one's parent while that parent
    has exactly one child, at most ``limit`` of them; none is reported dead (the layout's one
    chain pool records its own block ends)."""
    parents, _, _, run = forest
    index = built(parents, [], [])
    children = {}
    for b, p in enumerate(parents):
        if p is not None:
            children[p] = children.get(p, 0) + 1
    want, b = [], run[0]
    while len(want) < limit and parents[b] is not None and children[parents[b]] == 1:
        b = parents[b]
        want.append(b)
    ups, dead = index.lone_ancestors(PK[0], PK[1], run[0], limit)
    assert ups == want and dead == [False] * len(want)
