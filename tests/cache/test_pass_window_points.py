"""A commit that passes a checkpoint whose objects are all windows captures it
(``Snapshots.passable``): on a full + SWA layout with a checkpoint every granule, one commit of
a whole prefill keeps the same snapshots, with the same rows, as commits split at every
checkpoint (what an engine had to do before, one commit per block), and a later prompt resumes
at the same position."""
import pytest
import torch

from hybridkv.cache import CacheManager
from hybridkv.layout import ModelLayout
from tests.cache.helpers import commit_all

FULL_SWA = ModelLayout.full(block_size=4, window=8)
PROMPT = [(13 * i + 7) % 200 for i in range(60)]


def manager(arena):
    if arena:       # the vLLM adapter's shape: one arena, window blocks of two pages
        return CacheManager(FULL_SWA, num_pages=400, block_pages={("swa", "swa"): 2},
                            every_n=4, checked=True)
    return CacheManager(FULL_SWA, num_blocks=200, every_n=4, checked=True)


def window_rows_coded(m, rid):
    """Each window row holds its position + 1 (row = position mod W of page position // W)."""
    pool, W = m.pools[("swa", "swa")], FULL_SWA.group("swa").window
    work = m.requests[rid].work["swa"]
    for j, o in enumerate(work.pages, start=work.first_page):
        rows = torch.arange(j * W, (j + 1) * W, dtype=torch.float32) + 1
        pool.data["kv"][:, pool.slot(o.ref.block)] = rows[None, :, None]


def snapshot_rows(m):
    """key -> the rows each published window snapshot holds (unwritten rows as -1)."""
    pool = m.pools[("swa", "swa")]
    return {key: torch.nan_to_num(pool.data["kv"][:, pool.slot(b)].clone(), nan=-1.0)
            for key, b in m.index.exact[("swa", "swa")].items()}


def served(split, arena=False):
    m = manager(arena)
    m.lookup("a", PROMPT)
    a = m.allocate("a", len(PROMPT))
    if not arena:
        window_rows_coded(m, "a")
    if split:
        commit_all(m, "a", a)
    else:
        m.commit("a", a.end - a.start)
    m.check_invariants()
    return m


@pytest.mark.parametrize("arena", [False, True])
def test_one_commit_keeps_every_window_snapshot_split_commits_keep(arena):
    split, whole = served(True, arena), served(False, arena)
    kept = set(whole.index.exact[("swa", "swa")])
    assert len(kept) >= len(PROMPT) // 4 - 2          # every granule's window, not the end's
    assert kept == set(split.index.exact[("swa", "swa")])
    for m in (split, whole):
        m.free("a")
        m.check_invariants()
    other = PROMPT[:37] + [199, 198, 197]
    assert whole.lookup("b", other).reuse_tokens == split.lookup("b", other).reuse_tokens == 36


def test_passed_snapshots_hold_the_rows_of_their_point():
    split, whole = snapshot_rows(served(True)), snapshot_rows(served(False))
    assert split.keys() == whole.keys()
    for key in split:
        assert torch.equal(split[key], whole[key]), key
    assert any((rows > 0).any() for rows in whole.values())
