"""The allocation fast paths (``CacheManager.allocate`` up to ``fast_end``: no block, no
checkpoint; up to ``reach_end``: window sub-pages alone, ``_reach``) against the full path on
every call.

``ObjectWriter.horizon`` sets ``fast_end`` below the next position where an allocation could
need a block, a sub-page or a snapshot (``Snapshots.next_point``: inside the prompt the next
granule, past it the next multiple of ``resume_every`` or ``every_n``).  Random call sequences
-- prompts sharing prefixes, decode runs, frees -- go to two managers: one as shipped, one
whose horizon never allows the fast path.  After every call both return the same allocation
and hold the same state (pool records and free lists, index, every eviction set and policy,
the KV events; ``test_evict_runs.state``).  Seeded: a horizon that ignores the provisional end
(a decode crossing a multiple of ``resume_every`` on the fast path) writes no snapshot there,
and the comparison finds it.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import CacheManager
from hybridkv.errors import CacheError
from hybridkv.layout import LayerGroup, ModelLayout
from tests.cache.helpers import LAY, commit_all
from tests.cache.test_evict_runs import state

PAGES = ModelLayout([LayerGroup("g0", "full", (0,), 8, 0, head_dim=1),     # a window page
                     LayerGroup("g1", "swa", (1,), 4, 12, head_dim=1)],    # of 3 sub-pages
                    name="pages")                                          # (the vLLM adapter's)
LAYOUTS = {"v4-mini": LAY, "full+swa": ModelLayout.full(block_size=4, window=8),
           "full": ModelLayout.full(block_size=4), "pages": PAGES}
PREFIXES = [[(5 * i + 1) % 200 for i in range(60)], [(3 * i + 7) % 200 for i in range(60)]]
STRIDES = {"granule": None, "long": 16}


def manager(layout, resume_every, every_n, fast=True):
    size = dict(num_pages=120, block_pages={("swa", "g1"): 3}) if layout is PAGES else \
        dict(num_blocks=64)
    m = CacheManager(layout, device="meta", checked=True, events=True,
                     resume_every=resume_every, every_n=every_n, **size)
    if not fast:
        horizon = m.writer.horizon

        def never_fast(req):
            horizon(req)
            req.fast_end = req.reach_end = -1
        m.writer.horizon = never_fast
    return m


def play(m, op, rid, prefix, n, steps):
    """One call; returns what the engine sees (allocations, hits, or the error's name)."""
    try:
        if op == "serve":
            tokens = PREFIXES[prefix][:n]
            plan = m.lookup(rid, tokens)
            a = m.allocate(rid, len(tokens) - plan.reuse_tokens)
            commit_all(m, rid, a)
            return plan.reuse_tokens, a.end, a.checkpoints
        if op == "decode":
            out = []
            for i in range(steps):
                a = m.allocate(rid, 1)
                m.commit(rid, 1, [(rid * 7 + i) % 200])
                out.append((a.start, a.end, a.checkpoints))
            return out
        m.free(rid)
    except CacheError as e:
        return type(e).__name__
    return None


calls = st.lists(st.tuples(
    st.sampled_from(("serve", "decode", "decode", "free")),
    st.integers(0, 2), st.integers(0, 1), st.integers(5, 60), st.integers(1, 24)),
    max_size=14)


@pytest.mark.parametrize("stride", sorted(STRIDES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=10, deadline=None)
@given(seq=calls, every_n=st.sampled_from([0, 0, 12]))
def test_the_fast_path_reaches_what_the_full_path_reaches(layout, stride, seq, every_n):
    fast = manager(LAYOUTS[layout], STRIDES[stride], every_n)
    full = manager(LAYOUTS[layout], STRIDES[stride], every_n, fast=False)
    for call in seq:
        assert play(fast, *call) == play(full, *call), call
        assert state(fast) == state(full), call
    fast.check_invariants()


@pytest.mark.parametrize("window, full_paths", [
    (8, [25, 29, 32, 33, 37, 41, 45]),      # full+SWA: the window snapshot at 32
    (None, [25, 29, 33, 37, 41, 45]),       # full attention: a point holds nothing
])
def test_a_decode_past_the_prompt_skips_the_full_path_between_strides(window, full_paths):
    """Past the prompt a decode step takes the full path only where it needs a block or
    reaches a multiple of ``resume_every`` whose checkpoint has an exact object: with a
    stride of 16 (blocks of 4, granule 4), a new block at 25, 29, ..., 45 and, on full+SWA,
    the stride point at 32 (a cap at every granule would add 24, 28, 36, 40 and 44); on full
    attention no point past the prompt writes anything (``Snapshots.objectless``), so 32 is
    a step like the others and no allocation names it."""
    m = manager(ModelLayout.full(block_size=4, window=window), 16, 0)
    calls = []
    full_path = m._allocate

    def counted(req, end, draft_end):
        calls.append(end)
        return full_path(req, end, draft_end)
    m._allocate = counted
    play(m, "serve", 0, 0, 21, 0)
    del calls[:]
    steps = play(m, "decode", 0, 0, 0, 24)          # positions 21..44
    assert calls == full_paths
    assert [cp for _, _, cp in steps if cp] == ([(32,)] if window else [])


def parts_from_the_full_path(seeded, layout, resume_every, calls):
    """Whether ``seeded`` (a manager with a bug planted) and the full path reach different
    states somewhere along ``calls``."""
    full = manager(layout, resume_every, 0, fast=False)
    parted = False
    for call in calls:
        play(seeded, *call), play(full, *call)
        parted = parted or state(seeded) != state(full)
    return parted


def test_seeded_a_horizon_past_the_provisional_end_is_found():
    """A fast path that ignores ``resume_every`` decodes across 16 and 32 without writing
    their provisional-end snapshots: the states part."""
    seeded = manager(LAYOUTS["v4-mini"], 8, 0)
    seeded.snapshots.next_point = lambda req, A: 1 << 62
    assert parts_from_the_full_path(seeded, LAYOUTS["v4-mini"], 8,
                                    [("serve", 0, 0, 13, 0), ("decode", 0, 0, 0, 24)])


def test_a_decode_reaching_a_window_sub_page_takes_the_reach_path():
    """Chain blocks of 8 tokens, a window page of 12 in 3 sub-pages of 4, a stride of 16:
    from position 21 on a decode takes the full path for a chain block (at 24, 32, 40), a
    window page (at 36) or the stride point (32: its window snapshot), and ``_reach`` where
    it needs only the next sub-page (at 28 and 44); every other step is bookkeeping."""
    m = manager(PAGES, 16, 0)
    full_calls, reach_calls = [], []
    full_path, reach_path = m._allocate, m._reach

    def counted_full(req, end, draft_end):
        full_calls.append(end)
        return full_path(req, end, draft_end)

    def counted_reach(req, start, end):
        reach_calls.append(end)
        return reach_path(req, start, end)
    m._allocate, m._reach = counted_full, counted_reach
    play(m, "serve", 0, 0, 21, 0)
    del full_calls[:], reach_calls[:]
    play(m, "decode", 0, 0, 0, 24)                   # positions 21..44
    assert full_calls == [25, 32, 33, 37, 41]
    assert reach_calls == [29, 45]
    m.check_invariants()


def test_seeded_a_reach_path_that_reaches_nothing_is_found():
    """A reach path that takes no sub-page leaves the arena's pages as they were: the
    states part."""
    seeded = manager(PAGES, 16, 0)
    seeded.writer.reach = lambda req, end: None
    assert parts_from_the_full_path(seeded, PAGES, 16,
                                    [("serve", 0, 0, 21, 0), ("decode", 0, 0, 0, 24)])
