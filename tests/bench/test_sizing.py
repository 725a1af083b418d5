"""bench.sizing: the replay's byte budget as one block arena (pages padded least by growing the
chained groups' blocks) or as fixed pools, and which one RuntimeManager picks."""
import pytest

from hybridkv.bench.runtime import RuntimeManager, runtime_layout
from hybridkv.bench.sizing import (PERIODIC_KEPT, RETAINED_PER_REQUEST, arena_layout,
                                   arena_sizing, byte_budget, runtime_pool_sizes, tuned,
                                   working_floor)


def _chain_bytes_per_512(rl, padded):
    """Bytes the chain blocks of 512 tokens take: their own, or a page each."""
    page = rl.page_nbytes()
    return sum((page if padded else rl.block_nbytes(*pk)) * 512 / rl.group(pk[1]).block_size
               for pk in rl.chain_pools())


@pytest.mark.parametrize("page", [512, 128])
def test_arena_layout_grows_chained_blocks_to_the_page(page):
    """v4-mini: the 32,512-byte HCA tail sets the page; CSA and HCA blocks double until their
    comp block fills it, so chain blocks pad 1.3x instead of 3.6x (512) / 11.9x (128), and the
    granule (where a hit may land) stays the page."""
    rl = runtime_layout("v4-mini", page)
    grown = arena_layout(rl)
    sizes = {g.name: g.block_size for g in grown.groups}
    assert sizes == {"swa": page, "csa": 1024, "hca": 32768}
    assert grown.page_nbytes() == 32768 and grown.granule == page
    padding = grown.page_padding()
    assert padding[("comp", "csa")] == padding[("comp", "hca")] == 0
    assert _chain_bytes_per_512(grown, True) < 1.3 * _chain_bytes_per_512(grown, False)
    assert _chain_bytes_per_512(rl, True) > 3.5 * _chain_bytes_per_512(rl, False)
    assert [(k, g) for k, g in grown.pool_keys()] == list(rl.pool_keys())
    full = runtime_layout("full", page)
    assert arena_layout(full) is full and not any(full.page_padding().values())


@pytest.mark.parametrize("cap", [50, 1000, 100000])
def test_arena_pages_hold_the_budget(cap):
    """Pages of the padded page: the fixed split's bytes, or the longest request's working
    objects when those are more."""
    rl = runtime_layout("v4-mini")
    grown = arena_layout(rl)
    budget = byte_budget(rl, cap)
    sz = arena_sizing(grown, budget, 20000, 2048, 0)
    floor = sum(working_floor(grown, 20000, 2048, 0).values())
    assert sz.floor_pages == floor and sz.page_nbytes == 32768
    assert sz.num_pages == max(floor, budget // 32768)
    assert budget == runtime_pool_sizes(rl, cap, 20000).budget_bytes == cap * 26880
    m = RuntimeManager("v4-mini", cap, 20000, arena=True)
    assert m.mgr.arena.num_pages == sz.num_pages and m.describe()["bytes"] == sz.num_pages * 32768


def test_memory_default_is_the_arena_where_it_pads_nothing():
    full, v4 = RuntimeManager("full", 100, 1300), RuntimeManager("v4-mini", 100, 1300)
    assert full.mgr.arena is not None and full.describe()["arena"]["pages"] == 100
    assert v4.mgr.arena is None and v4.describe()["num_blocks"]["comp/csa"] > 0
    assert RuntimeManager("v4-mini", 100, 1300, arena=True).mgr.arena is not None
    assert RuntimeManager("full", 100, 1300, arena=False).mgr.arena is None
    with pytest.raises(ValueError, match="fixed split"):
        RuntimeManager("v4-mini", 100, 1300, arena=True, snapshot_fraction=0.2)


@pytest.mark.parametrize("granule, capacity, want", [
    (None, 100_000, (1024, True)),         # dense: every 1024 tokens, forks on
    (16, 100_000, (16, True)),             # dense, a finer granule: every granule
    (128, 100_000, (1024, True)),          # the granule is the page: as the page
    (16, 1_000, (0, True)),                # not dense: forks only
])
def test_tuned_retention_follows_the_budget_and_the_granule(granule, capacity, want):
    """``tuned``: forks at every budget, periodic checkpoints once it holds 2000 mean prompts
    (``DENSE_REQUESTS``); on a trace of blocks finer than the page, as dense as its blocks."""
    got = tuned("v4-mini", capacity, 800, 128, granule)
    assert (got["every_n"], got["forks"]) == want
    assert tuned("full", capacity, 800, 128, granule)["every_n"] == 0
    m = RuntimeManager("v4-mini", capacity, 2000, 800, block_tokens=granule or 128)
    assert m.describe()["every_n"] == want[0] and m.describe()["forks"] is want[1]


def test_tuned_sets_count_half_the_periodic_checkpoints_but_every_fine_granule():
    """Checkpoint sets per chain unit: the end and branch points (RETAINED_PER_REQUEST) plus
    PERIODIC_KEPT of the periodic ones; where every granule is checkpointed (finer than the
    page) all of them, as LRU keeps every block's state."""
    mean, page = 12_000, 512
    periodic = tuned("v4-mini", 100_000, mean, page)
    assert periodic["every_n"] == 1024
    assert periodic["checkpoints_per_chain"] == pytest.approx(
        (RETAINED_PER_REQUEST + PERIODIC_KEPT * mean / 1024) * page / mean)
    fine = tuned("v4-mini", 100_000, mean, page, granule=16)
    assert fine["checkpoints_per_chain"] == pytest.approx(
        (RETAINED_PER_REQUEST + mean / 16) * page / mean)
    assert tuned("v4-mini", 1_000, mean, page)["checkpoints_per_chain"] == pytest.approx(
        RETAINED_PER_REQUEST * page / mean)
