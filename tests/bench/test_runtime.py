"""`hybridkv replay`: traces through the real CacheManager (bench.runtime), against the LRU and
Belady baselines, and the command line (one JSON object, --plot, --block-tokens)."""
import argparse
import json

import pytest

from hybridkv.bench.layouts import FULL
from hybridkv.bench.replay import compare, replay
from hybridkv.bench.runtime import RuntimeLayoutError, RuntimeManager, runtime_layout
from hybridkv.bench.sizing import runtime_pool_sizes, working_floor
from hybridkv.bench.traces import Request, Trace, synthetic_trace
from hybridkv.commands import replay as replay_cmd


def _trace(rows, block=512):
    """rows: (input_length, hash_ids) in arrival order."""
    return Trace("t", tuple(Request(i, n, 1, tuple(ids)) for i, (n, ids) in enumerate(rows)),
                 block)


# A, then B extending A's two full blocks, then A again: 1024 reusable tokens each time (A's
# third block is partial, and at least one token is always computed).
THREE = [(1100, (0, 1, 2)), (1300, (0, 1, 3)), (1100, (0, 1, 2))]


@pytest.mark.parametrize("arena", [True, False])
@pytest.mark.parametrize("layout", ["full", "v4-mini"])
def test_exact_hits_on_a_known_trace(layout, arena):
    tr = _trace(THREE)
    m = RuntimeManager(layout, 100, 1300, checked=True, arena=arena)
    got = [m.serve(tr, r, m.prepare(tr, r)).hit_tokens for r in tr.requests]
    assert got == [0, 1024, 1024]
    m.mgr.check_invariants()
    assert m.refused == 0 and m.ops > 3 * len(tr)


@pytest.mark.parametrize("layout, cap, arena", [("full", 50, None), ("v4-mini", 150, False),
                                               ("v4-mini", 300, True)])
def test_checked_replay_under_pressure_keeps_the_invariants(layout, cap, arena):
    """Every spec invariant after every manager call (checked mode; the arena's page routing
    too), with request hints, while a small cache evicts; nothing refused."""
    tr = synthetic_trace(30, seed=4, active=6)
    lengths = [r.input_length for r in tr.requests]
    m = RuntimeManager(layout, cap, max(lengths), sum(lengths) / len(lengths),
                       checked=True, arena=arena)
    hits = sum(m.serve(tr, r, m.prepare(tr, r)).hit_tokens for r in tr.requests)
    m.mgr.check_invariants()
    assert hits > 0 and m.refused == 0 and sum(m.mgr.metrics.evictions.values()) > 0


def test_arena_pages_move_between_kinds():
    """v4-mini on one arena: long prompts first (their chain blocks fill the pages), then short
    ones (a checkpoint's exact objects per request, hardly any chain): each kind's peak pages
    add up to more than the arena holds, so pages went from chain pools to snapshot pools --
    no fixed split allows that.  Every pool evicts through its own policy meanwhile."""
    ids = iter(range(10**6))
    rows = [(8292, tuple(next(ids) for _ in range(17))) for _ in range(12)]
    rows += [(700, (next(ids), next(ids))) for _ in range(40)]
    tr = _trace(rows)
    m = RuntimeManager("v4-mini", 400, 8292, arena=True, checked=True)
    peak = {}
    for r in tr.requests:
        m.serve(tr, r, m.prepare(tr, r))
        for kind, pages in m.mgr.stats()["arena"]["used"].items():
            peak[kind] = max(peak.get(kind, 0), pages)
    m.mgr.check_invariants()
    pages = m.describe()["num_pages"]
    assert sum(peak.values()) > pages, (peak, pages)
    assert peak["comp/csa"] > 2 * m.mgr.stats()["arena"]["used"]["comp/csa"]
    assert m.refused == 0 and {"comp", "idx", "swa", "tail"} <= set(m.mgr.metrics.evictions)


def test_hints_off_still_hits():
    for layout in ("full", "v4-mini"):
        m = RuntimeManager(layout, 100, 1300, hints=False)
        assert replay(_trace(THREE), m, FULL).hit_tokens == 2048
        assert m.describe()["hints"] is False


@pytest.mark.parametrize("block", [16, 48, 512])
def test_block_tokens_with_partial_last_blocks(block):
    """Hash ids of `block`-token blocks, lengths not a multiple of it: B repeats all of A's
    whole ids (>= 1056 tokens), then goes its own way; B reuses the shared tokens that fill
    whole granules of A: `block`-token pages in full, in v4-mini the trace's block where it
    divides the page (a multiple of 128: A's repeat point), else the page."""
    n_a, n_b = -(-1100 // block), -(-1500 // block)
    a = (1100, tuple(range(n_a)))
    b = (1500, tuple(range(n_a - 1)) + tuple(10_000 + i for i in range(n_b - n_a + 1)))
    tr = _trace([a, b], block)
    toks = [RuntimeManager("full", 10, 1500).prepare(tr, r) for r in tr.requests]
    assert [len(t) for t in toks] == [1100, 1500]
    shared = (n_a - 1) * block
    assert toks[0][:shared] == toks[1][:shared] and toks[0][shared] != toks[1][shared]
    for layout, page in (("full", block), ("v4-mini", -(-block // 128) * 128)):
        m = RuntimeManager(layout, 100, 1500, block_tokens=block)
        r = replay(tr, m, FULL)
        assert m.describe()["page_tokens"] == page
        granule = block if page % block == 0 else page     # (the hash granule, runtime_layout)
        assert (r.hit_tokens, r.total_tokens) == (shared // granule * granule, 2600), \
            (layout, block)


@pytest.mark.parametrize("block", [16, 32])
def test_small_trace_blocks_page_at_the_trace_block(block):
    """Ample capacity, 16/32-token hash ids: pages of the trace's block keep every whole trace
    block a hit covers, so ours >= LRU under the engine rule (512-token pages lost the partial
    page and fell below it); the byte budget is the same as at 512-token pages."""
    tr = synthetic_trace(200, seed=2, block_size=block)
    r = compare(tr, "full", 10_000)
    assert r["ours"]["hit_rate"] >= r["lru"]["hit_rate"] > 0, (r["ours"], r["lru"])
    assert r["runtime"]["page_tokens"] == block and r["runtime"]["refused"] == 0
    at_512 = RuntimeManager("full", 10_000, max(q.input_length for q in tr.requests)).sizing
    assert r["runtime"]["budget_bytes"] == at_512.budget_bytes
    assert r["runtime"]["num_pages"] == at_512.num_pages * 512 // block


def test_ours_beats_lru_where_lru_keeps_dead_blocks():
    """Bench multi-turn trace: a request's partial last block is never reused, the runtime never
    caches it, and the request hints file never-reused classes first; LRU keeps both."""
    tr = synthetic_trace(300, seed=1)
    for layout in ("full", "v4-mini"):
        r = compare(tr, layout, 300)
        ours, lru, bel = r["ours"], r["lru"], r["belady"]
        assert (r["runtime"]["arena"] is not None) == (layout == "full")    # the default memory
        assert ours["hit_tokens"] > 0 and r["runtime"]["refused"] == 0
        assert ours["hit_rate"] > lru["hit_rate"], (layout, ours["hit_rate"], lru["hit_rate"])
        if layout == "full":                  # same blocks, same capacity: MIN bounds the hits
            assert ours["block_hit_rate"] <= bel["block_hit_rate"]
        assert ours["recomputed_tokens"] == ours["total_tokens"] - ours["hit_tokens"]
        assert 0 < ours["flops_saved"] < ours["flops_total"]
        assert ours["ops"] > 3 * ours["requests"] and ours["ops_per_s"] > 0


def test_ours_on_the_arena_beats_lru_at_small_blocks():
    """v4-mini on one arena at 16-token ids and 300 blocks: the arena's pages pad (about a third
    of them), yet ours stays above LRU, which keeps a window and tails at every 16-token block
    end; fixed pools hit more than both (why they are v4-mini's default: revisit it when this
    fails)."""
    tr = synthetic_trace(200, seed=2, block_size=16)
    arena = compare(tr, "v4-mini", 300, arena=True)
    fixed = compare(tr, "v4-mini", 300, arena=False)
    assert arena["runtime"]["arena"]["padding_waste"]["held"] > 0.2
    assert arena["runtime"]["refused"] == fixed["runtime"]["refused"] == 0
    assert fixed["ours"]["hit_rate"] > arena["ours"]["hit_rate"] > arena["lru"]["hit_rate"] > 0


@pytest.mark.parametrize("arena", [True, False])
def test_v4_mini_resumes_at_the_trace_s_small_blocks(arena):
    """On a 16-token-block trace v4-mini's compressed blocks stay at 128 tokens (whole HCA
    entries) and its window group at 16: the hash granule is the trace's block.  B parts from
    A at 144 tokens, inside the second compressed block; C shares 160 with B: it resumes at
    B's fork, 144 (``forks``: SeenPrefixes, a page or more in), where without forks it resumes
    at B's branch point, 128, the end of the compressed chain it extends (none in the arena,
    whose grown compressed blocks hold 1024 tokens and more).  A 48-token block does not
    divide the page: the layout keeps one granule, the page."""
    assert runtime_layout("v4-mini", 128, block_tokens=16).granule == 16
    assert runtime_layout("v4-mini", 128).granule == 128
    assert runtime_layout("v4-mini", 128, block_tokens=48).granule == 128
    tr = _trace([(200, tuple(range(13))), (200, tuple(range(9)) + (100, 101, 102, 103)),
                 (200, tuple(range(9)) + (100, 200, 201, 202))], block=16)
    got = {}
    for forks in (True, False):
        m = RuntimeManager("v4-mini", 100, 200, checked=True, arena=arena, block_tokens=16,
                           forks=forks)
        assert {g.name: g.block_size for g in m.rlayout.groups}["swa"] == 16
        got[forks] = [m.serve(tr, r, m.prepare(tr, r)).hit_tokens for r in tr.requests]
        m.mgr.check_invariants()
        assert m.describe()["forks"] is forks
    assert got == {True: [0, 0, 144], False: [0, 0, 128 if not arena else 0]}


@pytest.mark.parametrize("cap", [100, 2000, 50000])
def test_pools_sized_from_the_byte_budget(cap):
    rl = runtime_layout("v4-mini")
    sz = runtime_pool_sizes(rl, cap, max_tokens=20000, every_n=0, snapshot_fraction=0.25)
    nb = sz.block_nbytes
    assert set(sz.sizes) == set(rl.pool_keys())
    assert sz.bytes == sum(sz.sizes[pk] * nb[pk] for pk in sz.sizes)
    floor = working_floor(rl, 20000, 2048, 0)
    assert all(sz.sizes[pk] >= floor[pk] for pk in floor)     # the longest request fits
    if sz.budget_bytes > sz.floor_bytes:                     # then the budget is what is used
        assert sz.budget_bytes - sz.unit < sz.bytes <= sz.budget_bytes
        rest = sz.budget_bytes - sz.floor_bytes
        assert abs(sz.checkpoints * sz.ckpt_bytes - 0.25 * rest) <= sz.ckpt_bytes
    full = runtime_pool_sizes(runtime_layout("full"), cap, max_tokens=20000)
    assert full.sizes == {("comp", "full"): max(cap, full.floor_bytes // full.unit)}
    m = RuntimeManager("v4-mini", cap, 20000, every_n=0, snapshot_fraction=0.25)
    assert {pk: p.n for pk, p in m.mgr.pools.items()} == sz.sizes
    assert str(m.mgr.device) == "meta"


def test_request_hints_reach_the_policy_classes():
    m = RuntimeManager("v4-mini", 100, 1300)
    tr = _trace(THREE)
    for r in tr.requests:
        m.serve(tr, r, m.prepare(tr, r))
    classes = {c for pol in m.mgr.evictor.policies.values() for c in pol._entered}
    assert ("checkpoint", "swa/end+repeat/out0", 0) in classes      # A's end, retained
    assert ("block", "comp/out0", 0) in classes
    with pytest.raises(RuntimeLayoutError):
        runtime_layout("dense")


# -- command line ---------------------------------------------------------------------------
def _main(argv):
    p = argparse.ArgumentParser()
    replay_cmd.add_arguments(p)
    return replay_cmd.run(p.parse_args(argv))


def _write(path, rows):
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": n,
                                        "output_length": 1, "hash_ids": list(ids)}) + "\n"
                            for i, (n, ids) in enumerate(rows)))
    return str(path)


def test_cli_json_is_one_object_and_block_tokens(tmp_path, capsys):
    rows = [(1100, range(69)), (1108, list(range(68)) + [99, 100])]  # 16-token ids: 68.75, 69.25
    path = _write(tmp_path / "t16.jsonl", rows)
    rc = _main([path, "--block-tokens", "16", "--layout", "v4-mini", "--capacity-blocks", "50",
                "--json", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("\n") == 1
    r = json.loads(out)
    assert r["block_tokens"] == 16 and r["requests"] == 2 and r["layout"] == "v4-mini"
    assert r["ours"]["hit_tokens"] == 1088 and r["ours"]["total_tokens"] == 2208   # 68 ids
    assert {"hit_rate", "ops_per_s", "requests_per_s", "latency_us"} <= set(r["ours"])
    assert r["runtime"]["device"] == "meta" and r["runtime"]["refused"] == 0
    assert r["runtime"]["hints"] is True
    assert isinstance(r["vllm"]["skipped"], str)
    assert _main([path, "--json", "--no-progress", "--strict"]) == 2  # 69 ids != 1100 / 512
    assert "HashIdCountMismatch" in json.loads(capsys.readouterr().out)["error"]


def test_cli_reports_the_timestamp_unit_and_the_reconciled_requests(tmp_path, capsys):
    """Nanosecond timestamps as strings, and one request whose ids disagree with its length:
    read, counted and reported; --strict refuses with the named error."""
    rows = [{"timestamp": "1718000000000000000", "input_length": 1100, "output_length": 1,
             "hash_ids": [0, 1, 2]},
            {"timestamp": "1718000002500000000", "input_length": 700, "output_length": 1,
             "hash_ids": [0, 1, 3]}]                                 # 3 ids, 700 tokens
    path = tmp_path / "wild.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [str(path), "--capacity-blocks", "50", "--no-progress"]
    assert _main(argv + ["--json"]) == 0
    reading = json.loads(capsys.readouterr().out)["reading"]
    assert reading == {"timestamp_unit": "ns", "span_s": 2.5, "hash_id_count_mismatches": 1,
                       "reconciled_tokens_added": 1025 - 700, "reconciled_tokens_removed": 0}
    assert _main(argv) == 0
    text = capsys.readouterr().out
    assert ("timestamps read in ns, span 2.5 s; 1 requests with a hash-id count other than "
            "ceil(input_length / 512)") in text
    assert "every_n 0, forks off" in text          # (full attention: no checkpoint objects)
    assert _main(argv + ["--strict"]) == 2
    err = capsys.readouterr().err
    assert "HashIdCountMismatch" in err and "line 2" in err and "[0, 1, 3]" in err


def test_cli_named_trace_resolves_to_the_shipped_file(capsys):
    assert _main(["mooncake-synthetic", "--limit", "20", "--capacity-blocks", "200", "--json",
                  "--no-progress", "--strict"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["trace"] == "synthetic_trace" and r["requests"] == 20
    assert r["reading"]["timestamp_unit"] == "ms" and r["reading"]["hash_id_count_mismatches"] == 0


def test_cli_plot_sweep(tmp_path, capsys):
    png = tmp_path / "hr.png"
    rc = _main(["synthetic", "--json", "--synthetic-requests", "60", "--capacity-blocks", "300",
                "--plot", str(png), "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p["capacity_blocks"] for p in out["sweep"]] == [300, 1000, 10000, 100000]
    assert all(p["refused"] == 0 and p["ours"] >= p["lru"] for p in out["sweep"])


def test_cli_memory_arena_or_fixed_pools(capsys):
    """--memory: the arena's pages and padding waste, or the fixed pools, in the text; auto is
    the fixed split on v4-mini (its arena pages pad) and the arena on full."""
    argv = ["synthetic", "--synthetic-requests", "20", "--layout", "v4-mini",
            "--capacity-blocks", "300", "--no-progress"]
    assert _main(argv + ["--memory", "arena"]) == 0
    out = capsys.readouterr().out
    assert "arena " in out and "padding waste" in out and "{'swa': 512, 'csa': 1024" in out
    assert _main(argv) == 0 and "fixed pools (" in capsys.readouterr().out
    assert _main(argv + ["--layout", "full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"]["arena"]["padding_waste"]["held"] == 0


@pytest.mark.parametrize("argv, err", [
    (["nowhere.jsonl"], "TraceFormatError"),
    (["synthetic", "--capacity-blocks", "-3"], "CapacityError"),
    (["synthetic", "--every-n", "100"], "ReplayArgumentError"),
    (["synthetic", "--block-tokens", "16", "--every-n", "40"], "multiple of --block-tokens (16)"),
    (["synthetic", "--snapshot-fraction", "1.5"], "ReplayArgumentError"),
    (["synthetic", "--memory", "arena", "--snapshot-fraction", "0.2"], "fixed split"),
    (["synthetic", "--block-tokens", "0"], "TraceFormatError"),
])
def test_cli_bad_input_exit_2(argv, err, capsys):
    assert _main(argv + ["--json", "--synthetic-requests", "5", "--no-progress"]) == 2
    assert err in json.loads(capsys.readouterr().out)["error"]


def test_cli_every_n_follows_the_trace_s_block(capsys):
    """A 16-token-block trace checkpoints at multiples of 16 (the runtime's granule)."""
    argv = ["synthetic", "--block-tokens", "16", "--every-n", "32", "--layout", "v4-mini",
            "--capacity-blocks", "50", "--synthetic-requests", "5", "--json", "--no-progress"]
    assert _main(argv) == 0
    assert json.loads(capsys.readouterr().out)["runtime"]["every_n"] == 32
