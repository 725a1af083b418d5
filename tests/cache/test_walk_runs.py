"""The funnel's chain walk checks a long run of found chain blocks as one run (numpy columns
through the same spec predicates, ``funnel._passing_prefix``); a short one block by block.
Both must give the same plan -- reads, rejections, resume point -- on every state: here
hypothesis builds states with long chains in which blocks are pinned, written over,
evicted, relocated, made stale or read under a new kernel version, and every lookup is run
both ways."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv.cache import CacheManager
from hybridkv.cache import funnel
from hybridkv.errors import AdmissionRefused, Refused
from hybridkv.layout import ModelLayout
from tests.cache.helpers import commit_all

LAYOUTS = {"full": ModelLayout.full(block_size=4), "v4-mini": ModelLayout.v4_mini()}
PROMPT = [(11 * i + 5) % 200 for i in range(700)]


def both_ways(monkeypatch, m, rid, tokens):
    """The plan with every run checked as one run, and block by block."""
    monkeypatch.setattr(funnel, "WALK_RUN_MIN", 1)
    batched = m.lookup(rid, tokens)
    monkeypatch.setattr(funnel, "WALK_RUN_MIN", 1 << 40)
    single = m.lookup(rid, tokens)
    return batched, single


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(layout=st.sampled_from(sorted(LAYOUTS)), data=st.data())
def test_run_and_block_by_block_walks_agree(monkeypatch, layout, data):
    lay = LAYOUTS[layout]
    m = CacheManager(lay, num_blocks=data.draw(st.integers(60, 400), label="blocks"))
    n_req = 0
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        n = data.draw(st.integers(lay.granule * 2, len(PROMPT)), label="prompt")
        tokens = PROMPT[:n]
        if data.draw(st.booleans(), label="fork"):
            cut = data.draw(st.integers(1, n - 1), label="cut")
            tokens = tokens[:cut] + [(t + 1) % 200 for t in tokens[cut:]]
        rid = f"r{n_req}"
        n_req += 1
        batched, single = both_ways(monkeypatch, m, rid, tokens)
        assert batched == single
        action = data.draw(st.sampled_from(["serve", "hold", "partial", "leave"]),
                           label="action")
        try:
            if action == "leave":
                m.free(rid)
                continue
            a = m.allocate(rid, len(tokens) - batched.reuse_tokens)
            if action == "partial":             # blocks left WRITING: not readable
                m.commit(rid, max(1, (a.end - a.start) // 2))
            else:
                commit_all(m, rid, a)
            if action == "serve":
                m.free(rid)
        except (AdmissionRefused, Refused):
            m.free(rid)
        if data.draw(st.booleans(), label="relocate"):
            for pk, pool in m.pools.items():
                held = [b for b, r in enumerate(pool.recs) if r.st == 2]
                if held:
                    m.relocate(pk[0], pk[1], data.draw(st.sampled_from(held), label="moved"))
                    break
        if data.draw(st.booleans(), label="new kernel") and not m.requests:
            kind, group = next(iter(m.pools))
            m.set_kernel_version(kind, group, data.draw(st.integers(1, 3), label="kv"))
    for probe in range(3):
        tokens = PROMPT[:data.draw(st.integers(lay.granule, len(PROMPT)), label="probe")]
        batched, single = both_ways(monkeypatch, m, f"probe{probe}", tokens)
        assert batched == single


def test_a_long_hit_is_checked_as_one_run(monkeypatch):
    """The run path is taken (and agrees) on a long full-attention hit, and a relocated block
    in the middle of the run still passes where the block-by-block walk passes it."""
    lay = LAYOUTS["full"]
    m = CacheManager(lay, num_blocks=400)
    plan = m.lookup("a", PROMPT)
    commit_all(m, "a", m.allocate("a", len(PROMPT)))
    m.free("a")
    calls = []
    real = funnel._passing_prefix
    monkeypatch.setattr(funnel, "_passing_prefix",
                        lambda *a: calls.append(len(a[3])) or real(*a))   # a[3]: blocks
    batched, single = both_ways(monkeypatch, m, "b", PROMPT)
    assert plan.reuse_tokens == 0 and batched == single
    assert calls and calls[0] >= 100 and batched.reuse_tokens >= 100 * lay.groups[0].block_size


@pytest.mark.parametrize("check", ["readable", "covers"])
def test_a_dropped_readiness_check_changes_the_run_path_too(monkeypatch, check):
    """The run path calls READY_CHECKS as the block path does: with 'readable' or 'covers'
    dropped, a chain of blocks still being written is taken as a hit by both paths alike
    (the seeded-bug tests' lever reaches the run path)."""
    lay = LAYOUTS["full"]
    m = CacheManager(lay, num_blocks=400)
    m.lookup("a", PROMPT)
    a = m.allocate("a", len(PROMPT))
    m.commit("a", (a.end - a.start) // 2)        # half the chain still WRITING
    honest = both_ways(monkeypatch, m, "b", PROMPT)
    monkeypatch.setitem(funnel.READY_CHECKS, "comp",
                        [c for c in funnel.READY_CHECKS["comp"] if c[0] != check])
    broken = both_ways(monkeypatch, m, "c", PROMPT)
    assert honest[0] == honest[1] and broken[0] == broken[1]
    if check == "readable":
        assert broken[0].reuse_tokens > honest[0].reuse_tokens


@pytest.mark.parametrize("readable", [0, 5, funnel.HEAD_RUN - 1, funnel.HEAD_RUN,
                                      funnel.HEAD_RUN + 1, 150])
def test_a_long_run_is_checked_its_head_first(monkeypatch, readable):
    """A chain the index finds far past its readable prefix (another request still writes
    it): the run path checks the head alone when it fails there, the whole run otherwise,
    and agrees with the block-by-block walk wherever the first unreadable block lies (in the
    head, at its last block, just past it, deep in the rest)."""
    lay = LAYOUTS["full"]
    bs = lay.groups[0].block_size
    m = CacheManager(lay, num_blocks=400)
    m.lookup("a", PROMPT)
    m.allocate("a", len(PROMPT))
    if readable:
        m.commit("a", readable * bs)            # the blocks after it stay WRITING
    checked = []
    real = funnel._passing_run
    monkeypatch.setattr(funnel, "_passing_run",
                        lambda *a: checked.append(len(a[3])) or real(*a))   # a[3]: blocks
    batched, single = both_ways(monkeypatch, m, "b", PROMPT)
    assert batched == single
    assert batched.reuse_tokens == readable * bs
    n_found = len(PROMPT) // bs - 1          # (the lookup leaves the last token to compute)
    assert checked[0] == funnel.HEAD_RUN
    assert sum(checked) == (funnel.HEAD_RUN if readable < funnel.HEAD_RUN else n_found)


def test_layer_4_verdict_per_slot_refuses_a_misaligned_pool(monkeypatch):
    """A pool checks layer 4 (can_hit_bytes) once per slot when it is built; a run reads that
    verdict.  On a pool whose slots are off the alignment every found block is refused at
    layer 4 on both walks (the run's and the block-by-block one), and nothing is reused."""
    from hybridkv.cache import pool as pool_mod
    lay = LAYOUTS["full"]
    tokens = PROMPT[:200]
    for align, aligned in ((pool_mod.GPU_BLOCK_ALIGN, True), (1 << 40, False)):
        monkeypatch.setattr(pool_mod, "GPU_BLOCK_ALIGN", align)
        m = CacheManager(lay, num_blocks=120)
        assert all(p.slots_aligned == aligned for p in m.pools.values())
        a = m.allocate("w", len(tokens) - m.lookup("w", tokens).reuse_tokens)
        commit_all(m, "w", a)
        m.free("w")
        batched, single = both_ways(monkeypatch, m, "r", tokens)
        assert batched == single
        if aligned:
            assert batched.reuse_tokens > 0
        else:
            assert batched.reuse_tokens == 0 and batched.reason == "4:bytes"


def test_a_new_abi_refuses_blocks_written_under_the_old_one(monkeypatch):
    """The run skips the per-block ABI read only while the pool's ABI never changed
    (``Pool.abi_uniform``); after set_kernel_version the old blocks fail layer 2 on both
    walks, and blocks written afterwards pass again."""
    lay = LAYOUTS["full"]
    m = CacheManager(lay, num_blocks=200)
    tokens = PROMPT[:200]
    commit_all(m, "w", m.allocate("w", len(tokens) - m.lookup("w", tokens).reuse_tokens))
    m.free("w")
    pool = m.pools[("comp", lay.groups[0].name)]
    assert pool.abi_uniform
    m.set_kernel_version("comp", lay.groups[0].name, 2)
    assert not pool.abi_uniform
    batched, single = both_ways(monkeypatch, m, "r", tokens)
    assert batched == single and batched.reuse_tokens == 0 and batched.reason == "2:abi"
    m.free("r")
    other = PROMPT[300:500]
    commit_all(m, "x", m.allocate("x", len(other) - m.lookup("x", other).reuse_tokens))
    m.free("x")
    batched, single = both_ways(monkeypatch, m, "y", other)
    assert batched == single and batched.reuse_tokens > 0
