"""`hybridkv replay --manager runtime`: the real CacheManager behind the replay seam."""
import json

import pytest

from hybridkv.bench.layouts import FULL, V4_MINI
from hybridkv.bench.runtime import (RuntimeLayoutError, RuntimeManager, block_nbytes,
                                   runtime_layout, runtime_pool_sizes)
from hybridkv.bench.sim import compare
from hybridkv.bench.traces import synthetic_trace
from hybridkv.cli import main


def test_runtime_replay_is_bounded_by_belady():
    tr = synthetic_trace(40, seed=3, tenants=2, active=4)
    r = compare(tr, V4_MINI, 400, ours_factory=RuntimeManager)
    ours, bel = r["ours"], r["belady"]
    assert 0.0 <= ours["hit_rate"] <= bel["hit_rate"]
    assert 0.0 <= ours["block_hit_rate"] <= bel["block_hit_rate"]
    assert ours["hit_tokens"] > 0                    # multi-turn prefixes do hit the runtime
    assert ours["ops_per_s"] > 0 and r["lru"]["ops_per_s"] > 0


def test_runtime_needs_hybrid_layout():
    with pytest.raises(RuntimeLayoutError):
        RuntimeManager(FULL, 10)


def test_cli_runtime_json_and_vllm_message(capsys):
    rc = main(["replay", "synthetic", "--manager", "runtime", "--layout", "v4-mini", "--json",
               "--synthetic-requests", "25", "--limit", "25", "--capacity-blocks", "200",
               "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["manager"] == "runtime" and out["requests"] == 25
    assert 0.0 <= out["ours"]["hit_rate"] <= out["belady"]["hit_rate"]
    assert out["sim_ours"]["hit_rate"] <= out["belady"]["hit_rate"]
    assert out["runtime_pools"]["every_n"] > 0 and out["runtime_pools"]["refused"] == 0
    assert set(out["vllm"]) == {"skipped"} and "vllm" in out["vllm"]["skipped"]
    rc = main(["replay", "synthetic", "--manager", "runtime", "--layout", "v4-mini",
               "--synthetic-requests", "10", "--limit", "10", "--capacity-blocks", "50",
               "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0 and "vLLM baseline: skipped: vllm" in text


@pytest.mark.parametrize("cap", [100, 2000, 50000])
def test_runtime_pools_sized_from_bytes(cap):
    rl = runtime_layout(V4_MINI)
    sz = runtime_pool_sizes(rl, cap, mean_tokens=8000, max_tokens=20000)
    nb = block_nbytes(rl)
    assert sz.block_nbytes == nb and set(sz.sizes) == set(rl.pool_keys())
    assert sz.bytes == sum(sz.sizes[pk] * nb[pk] for pk in sz.sizes)
    small = runtime_pool_sizes(rl, 1, mean_tokens=8000, max_tokens=20000)
    assert all(sz.sizes[pk] >= small.sizes[pk] >= 1 for pk in sz.sizes)   # floor: longest request
    if sz.bytes > small.bytes:                     # above the floor the budget is what is used
        assert 0.97 * sz.budget_bytes <= sz.bytes <= sz.budget_bytes
    assert len(set(sz.sizes.values())) > 1         # not one num_blocks for every pool
    m = RuntimeManager(V4_MINI, cap, mean_tokens=8000, max_tokens=20000)
    assert {pk: p.n for pk, p in m.mgr.pools.items()} == sz.sizes and m.mgr.every_n == sz.every_n
