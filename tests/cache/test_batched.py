"""Batched transitions (Pool.fire_run) against the per-block path (Pool.fire).

(a) Every (kind, state, event, guard outcome): a run over a grid of records -- every state, pins,
    draft, pub, version and epoch at and below their bounds, content complete or not -- reaches
    the records ``fire`` reaches block by block (checked mode: each block's real machine
    follows), and a run holding any block the table refuses raises and changes nothing.
(b) Random call sequences (hypothesis): one manager batching every run (``run_min`` 1) and one
    going block by block (``run_min`` above any run) serve the same calls and end every call in
    the same state (tests/cache/helpers.fingerprint) with the same outcome.
"""
import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hybridkv.cache import CacheManager
from hybridkv.cache.pool import Pool
from hybridkv.cache.tables import GroupCtx
from hybridkv.cache.tables import TransitionRefused
from hybridkv.layout import ModelLayout
from spec.effects import EFFECTS
from spec.state import KINDS
from tests.cache.helpers import LAY, fingerprint
from tests.cache.test_evict_runs import play    # prompts: the first 96 tokens of its
# first two prefixes

PER_BLOCK = 1 << 30          # run_min no run reaches: the per-block reference path
BOUND = 2                    # max_ver = max_ep: a counter at its bound refuses evict / relocate
EVENTS = sorted(set(EFFECTS) - {"load_ok"})       # load_ok's payload is never fired as a run
ARGS = {"write": ([8], 0), "draft": ([8], 1)}     # a list: one value per block


def grid(pool):
    """Records over every state of the pool's machine and each field near the values guards
    test: pins 0-2, draft, pub, a counter at its bound, content written at 8 or completed
    (and, for the indexer, built by the current version or an older one)."""
    rec_type, cx = pool.rec_type, pool.ctx
    ivs = (0, 1) if "iv" in rec_type._fields else (None,)
    out = []
    for st_, pins, draft, pub, (ver, ep), full, iv in itertools.product(
            sorted(pool.table.states), (0, 1, 2), (0, 1), (0, 1),
            ((0, 0), (BOUND, 0), (0, BOUND)), (0, 1), ivs):
        r = rec_type(st=st_, pins=pins, draft=draft, pub=pub, ver=ver, ep=ep)
        r = r._replace(**r.partial_at(8, cx))
        r = r._replace(**r.completed(cx)) if full else r
        out.append(r if iv is None else r._replace(iv=iv))
    return out


def manager(n, run_min, layout=LAY):
    m = CacheManager(layout, num_blocks=n, device="meta", checked=True, max_ver=BOUND,
                     max_ep=BOUND)
    for pool in m.pools.values():
        pool.run_min = run_min
    return m


def tables(m):
    """Each request's block tables and window pages (what the kernels read, what slides)."""
    return {rid: {g: (t.comp, t.idx, t.swa, req.work[g].first_page,
                      [o.ref for o in req.work[g].pages])
                  for g, t in req.tables.items() if g in req.work}
            for rid, req in m.requests.items()}


def make_pool(kind, n, run_min):
    """One pool of ``kind`` (bookkeeping only: meta device); the batched one is checked."""
    g = next(g for g in LAY.groups if kind in g.kinds)
    pool = Pool(kind, g, n, LAY.pool_tensors(kind, g), LAY.abi(kind, g),
                GroupCtx(g, BOUND, BOUND), "meta", checked=run_min < PER_BLOCK)
    pool.run_min = run_min
    return pool


@pytest.mark.parametrize("kind", [k if k == "comp" else pytest.param(k, marks=pytest.mark.slow)
                                  for k in KINDS])    # comp by default, every kind: -m slow
def test_every_state_event_and_guard_outcome(kind):
    recs = grid(make_pool(kind, 1, 1))
    outcomes = set()
    for event in EVENTS:
        if event == "slide" and kind != "swa":
            continue
        ref_pool, run_pool = make_pool(kind, len(recs), PER_BLOCK), make_pool(kind, len(recs), 1)
        args = ARGS.get(event, ())
        ref_pool.load_records(recs)
        run_pool.load_records(recs)
        enabled = []
        for b, r in enumerate(recs):
            ok = ref_pool.target(b, event) is not None
            outcomes.add((r.st, event, ok))
            if ok:
                enabled.append(b)
                ref_pool.fire(b, event, *(a[0] if isinstance(a, list) else a for a in args))
        col = [a * len(enabled) if isinstance(a, list) else a for a in args]
        run_pool.fire_run(enabled, event, *col)
        assert list(run_pool.recs) == list(ref_pool.recs), event
        assert (run_pool.n_free, run_pool.n_writing) == (ref_pool.n_free, ref_pool.n_writing)
        assert run_pool.check_integrity() == ref_pool.check_integrity()
        refused = sorted(set(range(len(recs))) - set(enabled))
        if refused:
            before = list(run_pool.recs)
            with pytest.raises(TransitionRefused):
                run_pool.fire_run(enabled[:3] + refused[:1],
                                  event, *[a[:1] * 4 if isinstance(a, list) else a for a in args])
            assert list(run_pool.recs) == before
    # every guarded (state, event) was seen both enabled and refused
    for st_, event, ok in list(outcomes):
        rows = ref_pool.table.rows.get((st_, event), ())
        if any(guards for guards, _ in rows) and len(rows) == 1:
            assert (st_, event, not ok) in outcomes, (kind, st_, event)


LAYOUTS = {"v4-mini": LAY, "full": ModelLayout.full(block_size=4)}
calls = st.lists(st.tuples(
    st.sampled_from(("serve", "serve", "decode", "free", "pin")),
    st.integers(0, 3),                                   # request id
    st.integers(0, 1), st.integers(8, 96), st.integers(0, 40)), max_size=12)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=20, deadline=None)
@given(seq=calls)
def test_random_calls_batched_equals_per_block(layout, seq):
    lay = LAYOUTS[layout]
    ref, run = manager(40, PER_BLOCK, lay), manager(40, 1, lay)
    ref.evictor.runs = False             # window pages written and released page by page too
    for call in seq:
        assert play(run, *call) == play(ref, *call), call
        assert fingerprint(run) == fingerprint(ref), call
        assert tables(run) == tables(ref), call
    run.check_invariants()


@settings(max_examples=200, deadline=None)
@given(stack=st.lists(st.integers(0, 5), max_size=20), flags=st.lists(st.booleans(),
       min_size=12, max_size=12), n=st.integers(0, 8))
@example(stack=[5, 3, 3], flags=[True] * 12, n=2)        # a repeat on top
@example(stack=[5, 2, 3], flags=[i != 2 for i in range(12)], n=2)   # a stale entry
def test_alloc_run_takes_what_alloc_then_write_takes_block_by_block(stack, flags, n):
    """``alloc_run(n)`` over any free stack (stale entries, repeats) takes the blocks and
    leaves the stack that n rounds of ``alloc`` + a write taking the block would."""
    def pool_with(stack, flags):
        pool = manager(12, 1).pools[next(iter(LAY.pool_keys()))]
        pool.free, pool.is_free = list(stack), bytearray(flags)
        return pool
    batched, single = pool_with(stack, flags), pool_with(stack, flags)
    got = batched.alloc_run(n)
    want = []
    for _ in range(n):
        b = single.alloc()
        if b is None:
            break
        want.append(b)
        single.is_free[b] = 0           # written: no longer FREE
    assert got == want
    for b in got:
        batched.is_free[b] = 0
    assert [batched.alloc() for _ in range(2)] == [single.alloc() for _ in range(2)]
    assert [b for b in batched.free if batched.is_free[b]] == \
        [b for b in single.free if single.is_free[b]]
