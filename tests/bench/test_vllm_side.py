"""The vLLM side of the side-by-side benchmark: stream generators (always) and
hybridkv/bench/vllm_side.py run under the separate vLLM environment (skipped, with the reason,
when it is absent or cannot import vllm: set HYBRIDKV_VLLM_PYTHON or create ../vllm-venv with
scripts/vllm_venv)."""
import ast
import sys

import pytest

from hybridkv.bench.vllm_streams import (SCRIPT, VLLM_PYTHON_ENV, decode_stream,
                                         mooncake_stream, run_vllm_side, tiny_stream,
                                         write_stream)
from hybridkv.bench.vs_vllm import vllm_status
CALL_TYPES = ("lookup", "lookup_excl_hash", "prefill_allocate", "decode_step",
              "decode_step_excl_hash", "decode_step_first", "decode_step_later", "free",
              "new_step_starts")


def test_vllm_side_imports_only_stdlib_torch_vllm():
    """It runs by file path under another environment: nothing of ours may be imported."""
    tree = ast.parse(open(SCRIPT).read())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) == {"torch", "vllm"}


def test_vllm_side_summarize_is_the_one_percentile_convention():
    """vllm_side.py cannot import ours; its summarize must equal percentile.summarize."""
    import random

    from hybridkv.bench.percentile import summarize
    tree = ast.parse(open(SCRIPT).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "summarize")
    space = {}
    exec(compile(ast.Module([fn], []), SCRIPT, "exec"), space)
    rng = random.Random(0)
    for n in (0, 1, 2, 3, 7, 99, 100, 101, 1000):
        samples = [rng.randrange(1, 10 ** 7) for _ in range(n)]
        assert space["summarize"](samples) == summarize(samples), n


def test_tiny_stream_shares_prefixes():
    stream = tiny_stream("full+swa", "decode")
    prompts = [r["prompt"] for r in stream["requests"]]
    assert len(prompts) == 5 and all(len(p) == 104 for p in prompts)
    assert len({tuple(p[:64]) for p in prompts}) == 1
    assert len({tuple(p[64:]) for p in prompts[:4]}) == 4
    assert prompts[4] == prompts[0]
    assert stream["attention"] == "full+swa" and stream["mode"] == "decode"


def test_decode_stream_half_share_one_prefix():
    stream = decode_stream(num_requests=8, decode_steps=3, prompt_len=100, shared_prefix_len=40)
    requests = stream["requests"]
    assert stream["mode"] == "decode" and len(requests) == 8
    assert all(len(r["prompt"]) == 100 and r["decode_steps"] == 3 for r in requests)
    heads = [tuple(r["prompt"][:40]) for r in requests]
    shared = max(set(heads), key=heads.count)
    assert heads.count(shared) == 4
    assert decode_stream(8, 3, 100, 40) == stream   # deterministic


def test_mooncake_stream_lengths():
    stream = mooncake_stream("mooncake-conversation", limit=3, decode_steps=4)
    lengths = [len(r["prompt"]) for r in stream["requests"]]
    assert lengths == [6758, 7322, 7236]
    # All three start with hash id 0: one shared 512-token block, then different blocks.
    a, b, _ = (r["prompt"] for r in stream["requests"])
    assert a[:512] == b[:512] and a[512:1024] != b[512:1024]


def _fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_vllm_python_without_vllm_is_skipped_with_the_reason(tmp_path, monkeypatch):
    """An environment that exists but cannot import vllm: a skip naming the import error, not a
    failure of every vLLM test."""
    broken = _fake_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2; "
                                    "exit 1")
    monkeypatch.setenv(VLLM_PYTHON_ENV, broken)
    python, reason = vllm_status()
    assert python is None
    assert broken in reason and "exit 1" in reason and "No module named 'vllm'" in reason


def test_a_vllm_python_that_imports_vllm_is_used(tmp_path, monkeypatch):
    working = _fake_python(tmp_path, 'test "$3" = "import vllm"')
    monkeypatch.setenv(VLLM_PYTHON_ENV, working)
    assert vllm_status() == (working, None)


def run(vllm_python, tmp_path, stream):
    path = tmp_path / "stream.json"
    write_stream(str(path), stream)
    return run_vllm_side(vllm_python, str(path), timeout_s=300)


@pytest.mark.parametrize("attention", ["full", "full+swa"])
@pytest.mark.parametrize("mode", ["serial", "decode"])
def test_vllm_side_tiny(vllm_python, tmp_path, attention, mode):
    stream = tiny_stream(attention, mode, decode_steps=20)
    out = run(vllm_python, tmp_path, stream)
    n = len(stream["requests"])
    timings = out["timings_us"]
    assert out["vllm_version"] == "0.33.0"
    assert set(timings) == set(CALL_TYPES)
    assert timings["lookup"]["count"] == timings["lookup_excl_hash"]["count"] == n
    assert timings["prefill_allocate"]["count"] == n
    assert timings["decode_step"]["count"] == timings["decode_step_excl_hash"]["count"] == 20 * n
    assert timings["decode_step_first"]["count"] == n
    assert timings["decode_step_later"]["count"] == 19 * n
    assert timings["free"]["count"] == n
    for name in ("lookup", "prefill_allocate", "decode_step", "free"):
        t = timings[name]
        assert 0 < t["p50"] <= t["p99"] <= t["max"] and t["mean"] > 0
    assert timings["lookup"]["mean"] >= timings["lookup_excl_hash"]["mean"]
    assert out["refused"] == {"prefill": 0, "decode": 0, "request_ids": []}
    hits = out["hits"]
    assert hits["lookups"] == n and hits["prompt_tokens"] == 104 * n
    # r1..r3 reuse the 64-token prefix; r4 repeats r0: all but the last token, block-aligned.
    assert hits["hit_tokens"] == 3 * 64 + 96
    assert hits["hit_rate"] == pytest.approx(hits["hit_tokens"] / hits["prompt_tokens"], abs=1e-6)
    stats = hits["vllm_prefix_cache_stats"]
    assert (stats["requests"], stats["queries"], stats["hits"]) == (n, 104 * n, 288)
    assert out["config"]["attention"] == attention and out["config"]["mode"] == mode
    assert out["final"]["usage"] == 0.0   # everything freed
    assert out["wall_s"] > 0
    assert out["stream_s"] == pytest.approx(out["wall_s"], abs=1e-4)   # nothing measurement-only


def test_vllm_side_tight_budget_refuses(vllm_python, tmp_path):
    """16 blocks cannot hold five running 104-token requests: some allocation is refused, the
    request is freed (untimed) and skipped."""
    stream = tiny_stream("full", "decode", decode_steps=20, num_blocks=16)
    out = run(vllm_python, tmp_path, stream)
    refused = out["refused"]
    num_refused = refused["prefill"] + refused["decode"]
    assert num_refused > 0 and len(refused["request_ids"]) == num_refused
    timings = out["timings_us"]
    assert timings["lookup"]["count"] == timings["prefill_allocate"]["count"] == 5
    assert timings["free"]["count"] == 5 - num_refused
    assert out["hits"]["vllm_prefix_cache_stats"]["requests"] == 5 - refused["prefill"]
    assert out["final"]["usage"] == 0.0
