"""``group_ids`` names a window group's blocks page by page (a run of slid-past pages as one
run of nulls); the rule it must keep is the per-block one, restated here block by block as the
oracle: block b is sub-page b % k of window page b // k (k = W'/block_size), null where the
request no longer holds the page, and below a hit the hit's window snapshot's sub-page where
the block reaches into the hit's window [first_read(hit), hit), else null.  No vLLM needed."""
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from hybridkv.cache.arena import NO_PAGE
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.block_ids import NULL_BLOCK_ID, group_ids, hit_ids
from hybridkv.layout import LayerGroup


def per_block(g, tables, pages_of, hit, window_slot, start_block, end_block):
    bs, W, out = g.block_size, g.window, []
    oldest = g.first_read(hit) if window_slot is not None else 0
    for b in range(start_block, end_block):
        p = b * bs
        slot = tables.swa[p // W] if p // W < len(tables.swa) else -1
        if slot >= 0 and p < hit and window_slot is not None:
            slot = window_slot if p + bs > oldest else -1
        if slot < 0:
            out.append(NULL_BLOCK_ID)
            continue
        page = pages_of(slot)[p % W // bs]
        out.append(NULL_BLOCK_ID if page == NO_PAGE else page + 1)
    return out


@st.composite
def cases(draw):
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    k = draw(st.integers(1, 6))
    g = LayerGroup("g1", "swa", (0,), bs, k * bs)
    n_pages = draw(st.integers(0, 12))
    swa = draw(st.lists(st.sampled_from([-1, 1]), min_size=n_pages, max_size=n_pages))
    swa = [100 + 10 * j if s > 0 else -1 for j, s in enumerate(swa)]   # distinct slots
    pages = {slot: [slot] + draw(st.lists(st.one_of(st.just(NO_PAGE), st.integers(0, 999)),
                                          min_size=k - 1, max_size=k - 1))
             for slot in [*swa, 7] if slot >= 0}
    window_slot = draw(st.sampled_from([None, 7]))
    hit = draw(st.integers(0, (n_pages + 2) * k * bs))
    start = draw(st.integers(0, n_pages * k + 3))
    end = draw(st.integers(start, n_pages * k + 6))
    return g, SimpleNamespace(swa=swa), pages, hit, window_slot, start, end


@settings(max_examples=400, deadline=None)
@given(cases())
def test_page_by_page_names_what_the_per_block_rule_names(case):
    g, tables, pages, hit, window_slot, start, end = case
    calls = []

    def pages_of(slot):
        calls.append(slot)
        return pages[slot]
    got = group_ids(g, tables, pages_of, hit, window_slot, start, end)
    assert got == per_block(g, tables, pages.__getitem__, hit, window_slot, start, end)
    assert len(calls) <= len(tables.swa) + (end - start)     # never more than a call a block


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_hit_names_what_the_per_block_rule_names(case):
    """``hit_ids``: the hit's blocks [0, hit) before its first allocation, null below its
    window, the window snapshot's sub-pages from the first block reaching into it."""
    g, _, pages, hit, window_slot, _, _ = case
    bs, pages_of = g.block_size, pages.__getitem__
    want = [NULL_BLOCK_ID] * (hit // bs)
    if window_slot is not None:
        want = per_block(g, SimpleNamespace(swa=[0] * (hit // g.window + 1)), pages_of, hit,
                         window_slot, 0, hit // bs)
    assert hit_ids(g, (), window_slot, hit, pages_of) == want


def test_a_long_slid_window_is_one_run_of_nulls():
    g = LayerGroup("g1", "swa", (0,), 4, 8)
    tables = SimpleNamespace(swa=[-1] * 25_000 + [5])
    calls = []
    got = group_ids(g, tables, lambda s: calls.append(s) or [9, NO_PAGE], 0, None, 0, 50_002)
    assert got == [NULL_BLOCK_ID] * 50_000 + [10, NULL_BLOCK_ID] and calls == [5]


def test_a_page_outside_vllm_s_id_space_is_refused():
    g = LayerGroup("g1", "swa", (0,), 4, 8)
    with pytest.raises(BadArgument):
        group_ids(g, SimpleNamespace(swa=[5]), lambda s: [5, -7], 0, None, 0, 2)
