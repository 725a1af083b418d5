"""`hybridkv bench vs-vllm`: the hybridkv side on tiny streams (counts and hits consistent with
the stream, an exact repeat hits), the sizing from one byte budget, the guard stubs, the
hybridkv-only extras, the command without vLLM (one JSON object, vLLM skipped and why) and, when
the vLLM venv exists, a tiny interleaved run with its ratio table."""
import argparse
import json
import os
import subprocess
import sys

import pytest

from hybridkv.bench import hybridkv_side, vs_vllm
from hybridkv.bench.vllm_streams import REPO_ROOT, tiny_stream, write_stream

TINY_PROMPT, TINY_N, TINY_STEPS = 104, 5, 20
# r1..r3 reuse the 64-token prefix r0 wrote; r4 repeats r0: all but its last token, aligned down
TINY_HIT_TOKENS = 3 * 64 + 96


def tiny_job(pairing, mode="decode", budget=400 * 4096):
    stream = tiny_stream("full", mode, decode_steps=TINY_STEPS, **vs_vllm.VLLM_SHAPE)
    return vs_vllm.make_job("tiny", pairing, stream, budget, "cpu")


def replay_file(tmp_path, job, **hk):
    f = dict(job["file"])
    f["hybridkv"] = dict(f["hybridkv"], **hk)
    path = tmp_path / "stream.json"
    write_stream(str(path), f)
    return hybridkv_side.run(*hybridkv_side.load_stream(str(path)))


def check_counts(out, n=TINY_N, steps=TINY_STEPS):
    t = out["timings_us"]
    for name in ("lookup", "lookup_hash", "lookup_excl_hash", "prefill_allocate",
                 "prefill_commit", "prefill", "free", "decode_step_first"):
        assert t[name]["count"] == n, name
    assert t["decode_step"]["count"] == n * steps
    assert t["decode_step_later"]["count"] == n * (steps - 1)
    for name in ("lookup", "prefill", "decode_step", "free"):
        assert 0 < t[name]["p50"] <= t[name]["p99"] <= t[name]["max"]
    assert out["refused"] == {"prefill": 0, "decode": 0, "request_ids": []}
    assert out["final"]["requests"] == 0          # everything freed


@pytest.mark.parametrize("mode", ["serial", "decode"])
def test_hybridkv_side_tiny_v4_mini(tmp_path, mode):
    job = tiny_job("v4-mini", mode)
    out = replay_file(tmp_path, job)
    check_counts(out)
    hits = out["hits"]
    assert hits["lookups"] == TINY_N and hits["prompt_tokens"] == TINY_N * TINY_PROMPT
    assert hits["hit_tokens"] == TINY_HIT_TOKENS and hits["hit_requests"] == 4
    assert hits["hit_rate"] == pytest.approx(TINY_HIT_TOKENS / (TINY_N * TINY_PROMPT), abs=1e-6)
    assert out["config"]["mode"] == mode and out["hybridkv"]["guards"] == "on"
    assert out["hybridkv"]["pool_bytes"] <= 400 * 4096


def test_hybridkv_side_exact_repeat_hits(tmp_path):
    """The same prompt twice, serial: the second lookup resumes at its last aligned position
    before the last token (the 'repeat' retention point)."""
    job = tiny_job("v4-mini", "serial")
    prompt = job["file"]["requests"][0]["prompt"]
    job["file"]["requests"] = [{"id": "a", "prompt": prompt, "decode_steps": 2},
                               {"id": "b", "prompt": list(prompt), "decode_steps": 2}]
    out = replay_file(tmp_path, job)
    assert out["hits"]["hit_tokens"] == (TINY_PROMPT - 1) // 32 * 32 == 96
    assert out["hits"]["hit_requests"] == 1


def test_hybridkv_side_tiny_full_hits_like_vllm(tmp_path):
    out = replay_file(tmp_path, tiny_job("full"))
    check_counts(out)
    assert out["hits"]["hit_tokens"] == TINY_HIT_TOKENS


def test_hybridkv_side_tiny_full_counts(tmp_path):
    check_counts(replay_file(tmp_path, tiny_job("full")))


def test_hybridkv_side_guards_stubbed_same_hits(tmp_path):
    job = tiny_job("v4-mini")
    on, stub = replay_file(tmp_path, job), replay_file(tmp_path, job, guards="stubbed")
    assert stub["hybridkv"]["guards"] == "stubbed"
    assert stub["hits"] == on["hits"]


def test_hybridkv_side_guards_paired(tmp_path):
    """Lockstep guards on / stubbed: both managers see every call, agree on every outcome."""
    out = replay_file(tmp_path, tiny_job("v4-mini"), guards="paired", refusal_reps=2)
    assert out["hits"] == {"on": TINY_HIT_TOKENS, "stubbed": TINY_HIT_TOKENS}
    assert out["overhead"] > -1 and set(out["timed_s"]) == {"on", "stubbed"}
    assert out["p50_us"]["on"]["decode_step"] > 0 and out["p50_us"]["stubbed"]["free"] > 0
    assert [r["error"] for r in out["refusal"]] == ["RequestTooLarge"] * 2


def test_hybridkv_side_process_prints_one_json(tmp_path):
    job = tiny_job("full", "serial")
    path = tmp_path / "s.json"
    write_stream(str(path), job["file"])
    out = vs_vllm.run_hybridkv_side(str(path), timeout_s=120)
    check_counts(out)


def test_refused_allocation_is_counted(tmp_path):
    """A budget that holds one running request: in decode mode the later admissions are refused,
    freed untimed and skipped."""
    job = tiny_job("full", "decode")
    job["file"]["hybridkv"]["num_blocks"] = {"comp/full": 9}
    out = replay_file(tmp_path, job)
    refused = out["refused"]
    assert refused["prefill"] + refused["decode"] > 0
    assert len(refused["request_ids"]) == refused["prefill"] + refused["decode"]
    assert out["timings_us"]["lookup"]["count"] == TINY_N
    assert out["final"]["requests"] == 0


# -- sizing ---------------------------------------------------------------------------------
def test_sizing_full_pairing_same_blocks_both_sides():
    job = tiny_job("full", budget=4096 * 1000)
    sz = job["sizing"]
    assert sz["vllm"]["block_bytes"] == sz["hybridkv"]["block_bytes"]["comp/full"] == 4096
    assert sz["vllm"]["num_blocks"] == sz["hybridkv"]["pools"]["comp/full"] == 1000
    assert job["file"]["num_blocks"] == 1000 and job["file"]["attention"] == "full"


def test_sizing_v4_mini_within_budget_and_working_set():
    from hybridkv.cache.manager import CacheManager
    budget = 64 * 2 ** 20
    job = tiny_job("v4-mini", budget=budget)
    sz = job["sizing"]["hybridkv"]
    assert 0.99 * budget < sz["bytes"] <= budget
    layout = hybridkv_side.make_layout(job["file"]["hybridkv"]["layout"])
    working = CacheManager.pool_sizes(layout, TINY_PROMPT + TINY_STEPS, TINY_N, 32)
    for (k, g), n in working.items():
        assert sz["pools"][f"{k}/{g}"] >= n
    f = job["file"]
    assert f["attention"] == "full+swa" and f["retention_interval"] == 32
    assert f["hybridkv"]["every_n"] == 32 and f["hybridkv"]["layout"]["block_size"] == 32
    assert f["hybridkv"]["layout"]["window"] == f["sliding_window"]


def test_sizing_budget_below_working_set_refused():
    with pytest.raises(ValueError, match="working set"):
        tiny_job("v4-mini", budget=4096)


# -- the whole-stream row -------------------------------------------------------------------
def test_whole_stream_row_from_both_sides_rounds():
    """Median over rounds per side of stream_s, ratio hybridkv / vLLM; in the job's ratio rows
    after the call types."""
    hk = [{"stream_s": s} for s in (2.0, 9.0, 3.0)]
    vl = [{"stream_s": s} for s in (4.0, 1.0, 6.0)]
    w = vs_vllm.whole_stream(hk, vl)
    assert (w["hybridkv_s"], w["vllm_s"], w["ratio"]) == (3.0, 4.0, 0.75)
    assert w["hybridkv_s_rounds"] == [2.0, 9.0, 3.0] and w["vllm_s_rounds"] == [4.0, 1.0, 6.0]
    job = {"ratios": {"lookup": {"ratio_p50": 1.5}}, "whole_stream": w}
    assert vs_vllm.ratios(job) == [("lookup", 1.5), (vs_vllm.WHOLE_STREAM_ROW, 0.75)]
    assert vs_vllm.ratios({}) == []


def test_hybridkv_stream_s_drops_the_hashing_pass(tmp_path):
    """stream_s is the replay wall less the lookup_hash pass, which only measures."""
    out = replay_file(tmp_path, tiny_job("full"))
    hash_pass_s = out["timings_us"]["lookup_hash"]["mean"] * TINY_N / 1e6
    assert hash_pass_s > 1e-5
    assert out["stream_s"] == pytest.approx(out["wall_s"] - hash_pass_s, abs=3e-6)


# -- guards ---------------------------------------------------------------------------------
def test_stubbed_guards_restored_and_no_spec_guard_called(tmp_path):
    """Inside the stubs no spec guard runs during a replay except the one that chooses between
    two rows (can_unpin_keep); afterwards everything is back."""
    from hybridkv.cache import admission, funnel, manager, pool, tables
    from spec import state
    job = tiny_job("v4-mini")
    before = ({k: list(v) for k, v in funnel.READY_CHECKS.items()}, funnel.can_hit_abi,
              funnel.can_hit_aligned, funnel.can_hit_groups, pool.can_hit_bytes,
              admission.can_admit_objects, manager.can_read_pinned,
              [dict(tables.table_for(c).rows) for c in state.MACHINES])
    called = set()

    def prof(frame, event, arg):
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            name = frame.f_code.co_name
            if mod.startswith("spec.") and (name.startswith("can_") or
                                            name in ("covers", "readable")):
                called.add(name)
    config, hk, requests = hybridkv_side.load_stream(_write(tmp_path, job["file"]))
    with hybridkv_side.stubbed_guards():
        assert all(v == [] for v in funnel.READY_CHECKS.values())
        sys.setprofile(prof)
        try:
            hybridkv_side.replay(config, hk, requests)
        finally:
            sys.setprofile(None)
    assert called <= {"can_unpin_keep"}, called
    after = ({k: list(v) for k, v in funnel.READY_CHECKS.items()}, funnel.can_hit_abi,
             funnel.can_hit_aligned, funnel.can_hit_groups, pool.can_hit_bytes,
             admission.can_admit_objects, manager.can_read_pinned,
             [dict(tables.table_for(c).rows) for c in state.MACHINES])
    assert after == before
    called.clear()
    sys.setprofile(prof)
    try:
        hybridkv_side.replay(config, hk, requests)
    finally:
        sys.setprofile(None)
    assert {"can_hit_abi", "can_hit_aligned", "can_hit_bytes", "can_admit_objects",
            "can_seal"} <= called


def _write(tmp_path, f):
    path = tmp_path / "s.json"
    write_stream(str(path), f)
    return str(path)


# -- extras -----------------------------------------------------------------------------------
def test_extras_tiny(tmp_path):
    """Every extra as hybridkv_side processes: guards on vs stubbed (same hits), checked on vs
    off, the 10**9 refusal (refused, nothing changed), decode at a long vs a short context."""
    job = tiny_job("v4-mini", "serial", budget=8 * 2 ** 20)
    args = argparse.Namespace(rounds=1, checked_limit=2, context=(64, 1024, 8), refusal_reps=3,
                              timeout=120, context_min_rounds=1)
    errors, log = [], []
    out = vs_vllm.run_extras(_write(tmp_path, job["file"]), args, 8 * 2 ** 20, str(tmp_path),
                             log.append, errors)
    assert errors == []
    assert out["guards"]["same_hits"] and out["guards"]["hit_tokens"] == TINY_HIT_TOKENS
    assert out["guards"]["overhead"] > -1
    assert out["checked"]["requests"] == 2 and out["checked"]["ratio"] > 0
    assert [c["layout"] for c in out["context"]] == ["v4-mini", "full"]
    assert all(c["ratio"] > 0 and c["long"] == 1024 and c["rounds"] == 1
               for c in out["context"])
    assert [r["state"] for r in out["refusal"]] == ["looked-up", "running"]
    for r in out["refusal"]:
        assert r["error"] == "RequestTooLarge" and r["unchanged"] and r["p50_us"] > 0


# -- the command --------------------------------------------------------------------------------
def bench(*argv, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "hybridkv.commands.bench", "vs-vllm", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT, **(env or {})})


def test_cli_without_vllm_prints_one_json_object(tmp_path):
    nowhere = str(tmp_path / "no-such-python")
    proc = bench("--streams", "tiny", "--rounds", "1", "--no-extras", "--json",
                 env={"HYBRIDKV_VLLM_PYTHON": nowhere})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    out = json.loads(proc.stdout)
    assert out["vllm"]["python"] is None
    assert "vLLM" in out["vllm"]["skipped"] and nowhere in out["vllm"]["skipped"]
    assert "vLLM skipped" in proc.stderr
    assert [(j["stream"], j["pairing"]) for j in out["jobs"]] == [("tiny", "v4-mini"),
                                                                   ("tiny", "full")]
    for j in out["jobs"]:
        assert "vllm" not in j and "ratios" not in j and "whole_stream" not in j
        assert set(j["footprint"]) == {"hybridkv"}          # vLLM's pass skipped too
        assert j["hybridkv"]["timings_us"]["decode_step"]["count"] == TINY_N * TINY_STEPS
    assert out["jobs"][0]["hybridkv"]["hits"]["hit_tokens"] == TINY_HIT_TOKENS
    assert out["ratio_table"] == [] and out["errors"] == []


def test_cli_text_says_vllm_skipped(tmp_path):
    proc = bench("--streams", "tiny", "--pairings", "full", "--rounds", "1", "--no-extras",
                 "--no-footprint", env={"HYBRIDKV_VLLM_PYTHON": str(tmp_path / "nope")})
    assert proc.returncode == 0, proc.stderr
    assert "vLLM skipped: no vLLM python" in proc.stdout
    assert "decode_step" in proc.stdout and "bookkeeping" not in proc.stdout


def test_cli_bad_arguments():
    proc = bench("--streams", "nope")
    assert proc.returncode == 2 and proc.stdout == ""
    proc = bench("--streams", "tiny", "--rounds", "0")
    assert proc.returncode == 2 and proc.stdout == ""


@pytest.mark.slow     # ~80 s: both sides, every row (test_vllm_side's tiny runs cover the driver)
def test_cli_tiny_interleaved_ratio_table():
    python, skipped = vs_vllm.vllm_status()      # absent, or present but without vllm
    if python is None:
        pytest.skip(skipped)
    proc = bench("--streams", "tiny", "--pairings", "v4-mini", "--rounds", "2", "--no-extras",
                 "--json", timeout=400)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["vllm"]["skipped"] is None and out["vllm"]["version"] == "0.33.0"
    # interleaved: round 0 hybridkv then vLLM, round 1 vLLM then hybridkv
    order = [line.split()[-4] for line in proc.stderr.splitlines()
             if line.startswith("round ")]
    assert order == ["hybridkv:", "vllm:", "vllm:", "hybridkv:"], proc.stderr
    (job,) = out["jobs"]
    assert job["hybridkv"]["rounds"] == job["vllm"]["rounds"] == 2
    # same stream, same hits on both sides
    assert job["hybridkv"]["hits"]["hit_tokens"] == job["vllm"]["hits"]["hit_tokens"] \
        == TINY_HIT_TOKENS
    rows = job["ratios"]
    for row in ("lookup", "prefill_allocate", "decode_step", "free"):
        r = rows[row]
        assert r["ratio_p50"] == pytest.approx(r["hybridkv_p50"] / r["vllm_p50"], rel=1e-2)
    assert {(r["stream"], r["pairing"]) for r in out["ratio_table"]} == {("tiny", "v4-mini")}
    w = job["whole_stream"]
    assert len(w["hybridkv_s_rounds"]) == len(w["vllm_s_rounds"]) == 2
    assert w["ratio"] == pytest.approx(w["hybridkv_s"] / w["vllm_s"], rel=1e-2)
    assert out["ratio_table"][-1] == {"stream": "tiny", "pairing": "v4-mini",
                                      "row": vs_vllm.WHOLE_STREAM_ROW, "ratio_p50": w["ratio"]}
    assert vs_vllm.WHOLE_STREAM_ROW in vs_vllm.report(out)
    fp = job["footprint"]
    assert fp["ratios"] == vs_vllm.footprint_ratios(fp["hybridkv"], fp["vllm"])
    assert fp["vllm"]["num_blocks"] == 400 and fp["hybridkv"]["built_per_block"] > 0
    assert "bookkeeping bytes per block" in vs_vllm.report(out)
    assert len(job["hybridkv"]["timings_us"]["lookup"]["p50_rounds"]) == 2
