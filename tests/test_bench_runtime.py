"""`hybridkv replay --manager runtime`: the real CacheManager behind the replay seam."""
import json

import pytest

from hybridkv.bench.layouts import FULL, V4_MINI
from hybridkv.bench.runtime import RuntimeLayoutError, RuntimeManager
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
    try:
        import vllm  # noqa: F401
        has_vllm = True
    except Exception:
        has_vllm = False
    assert out["vllm"]["available"] == has_vllm
    if not has_vllm:
        assert out["vllm"]["message"].startswith("skipped: vllm not installed")
