"""`hybridkv bench vs-vllm`: the same request streams through hybridkv's CacheManager and vLLM's
KVCacheManager, each side in its own process, in interleaved rounds.

Jobs.  A job is one stream under one pairing:
  streams   mooncake  the first `limit` (300) Mooncake conversation requests, serial mode, a few
                      decode steps each (vllm_streams.mooncake_stream: the token ids of
                      traces.request_token_ids, the same for both sides);
            decode    32 requests x 256 decode steps, 2000-token prompts, half of them sharing
                      one 1024-token prefix (vllm_streams.decode_stream);
            tiny      five 104-token prompts (a shared prefix, an exact repeat; for tests).
  pairings  v4-mini   hybridkv ModelLayout.v4_mini(block_size=R, window=W, hca_ratio=min(128,
                      R), vocab=32000) with every_n=R  vs  vLLM full+swa (window W, prefix-cache
                      retention interval R); R=512, W=128 (tiny: R=32, W=32).  vLLM with
                      retention R keeps the sliding-window group's state only every R tokens, so
                      a full+swa hit lands on a multiple of R; hybridkv's granule is R (every
                      group pages by R tokens) and every_n=R retains a snapshot (window + tails)
                      every R tokens: both sides resume at the same positions, and both keep
                      window state for the same positions.
            full      hybridkv ModelLayout.full(block_size=B)  vs  vLLM full attention, block B
                      (B = 16).

One byte budget (`--budget-mib`, default 256 MiB) sizes both sides:
  vLLM      a block is one page of one layer (each KV cache group holds one layer, the groups
            share one pool): 2 (K, V) x block_size x num_kv_heads x head_size x itemsize bytes.
            The vLLM spec is num_kv_heads=1, head_size=32, float32, so a 16-token vLLM block
            is 4096 B = one hybridkv `full` block (4 layers x 16 rows x 16 dims x fp32): in the
            full pairing both sides get exactly num_blocks = budget // 4096.
  hybridkv  per pool (kind, group), bytes = layout.block_nbytes.  First the working set the
            stream's running requests need (CacheManager.pool_sizes for the longest request
            plus its decode steps, times the requests running at once: 1 in serial mode, all
            of them in decode mode), then the rest of the budget in proportion to the bytes a
            finished request keeps cached per R tokens (layout.objects_at(2R, since=R): its
            chain blocks and one retained snapshot).  The pools never exceed the budget (the
            command refuses a budget below the working set).
The manager latencies do not depend on the bytes (vLLM's manager holds no memory; hybridkv's
pools are real CPU tensors, `--device meta` for none): the budget sets the hit rates.

Rounds.  R rounds (`--rounds`, default 3); in round i every job runs its hybridkv process and
its vLLM process back to back (hybridkv first in even rounds, vLLM first in odd ones, so drift
falls on both).  Reported: per side and call type the median over rounds of each round's
p50 / p99, and the ratio table hybridkv p50 / vLLM p50 per call type (< 1: hybridkv faster),
plus its "whole stream (replay wall)" row: per side the median over rounds of the replay's wall
time (`stream_s`: the same requests served, construction excluded on both sides, hybridkv's
measurement-only hashing pass taken out; hybridkv_side / vllm_side say what is in it).

Footprint (`--no-footprint` skips it).  After the rounds, per job one untimed process per side
(`--footprint`) measures the manager's bookkeeping bytes per block: the Python heap it holds
after construction and after the stream, KV storage excluded (hybridkv.bench.footprint says
exactly what is counted); ratios hybridkv / vLLM per block, and of the bytes held after the
stream (both sides hold the same KV budget, so that one compares per KV byte).

Extras (hybridkv only, `run_extras`, hybridkv_side processes in interleaved rounds): decode p50
at a 64k-token context vs 2k, the guard overhead (every spec guard stubbed to True vs on), the
checked-mode cost, and the time `allocate(rid, 10**9)` takes to be refused.
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from hybridkv.bench import vllm_streams

DEFAULT_BUDGET_MIB = 256
STREAMS = ("mooncake", "decode", "tiny")
PAIRINGS = ("v4-mini", "full")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# One vLLM block (16 tokens, one layer, K and V) = 4096 B = one hybridkv ModelLayout.full(16)
# block (4 layers x 16 rows x 16 dims x 4 B).
VLLM_SHAPE = {"num_kv_heads": 1, "head_size": 32, "dtype": "float32"}
# (row name, hybridkv call type, vLLM call type)
RATIO_ROWS = (
    ("lookup", "lookup", "lookup"),
    ("lookup_excl_hash", "lookup_excl_hash", "lookup_excl_hash"),
    ("lookup (hybridkv incl. hash / vLLM excl. hash)", "lookup", "lookup_excl_hash"),
    ("prefill_allocate", "prefill_allocate", "prefill_allocate"),
    ("prefill (hybridkv allocate+commit)", "prefill", "prefill_allocate"),
    ("decode_step", "decode_step", "decode_step"),
    ("decode_step_first", "decode_step_first", "decode_step_first"),
    ("decode_step_later", "decode_step_later", "decode_step_later"),
    ("free", "free", "free"),
)
WHOLE_STREAM_ROW = "whole stream (replay wall)"


# -- sizing -----------------------------------------------------------------------------------
def vllm_block_bytes(cfg: dict) -> int:
    """Bytes of one vLLM pool block: one page of one layer (K and V)."""
    return (2 * cfg["block_size"] * cfg["num_kv_heads"] * cfg["head_size"]
            * ITEMSIZE[cfg["dtype"]])


def hybridkv_pool_sizes(layout, budget: int, every_n: int, max_tokens: int,
                        max_running: int) -> dict:
    """{(kind, group): num_blocks} holding at most ``budget`` bytes: the working set of
    ``max_running`` requests of ``max_tokens`` (CacheManager.pool_sizes), the rest split in
    proportion to what a finished request keeps cached per retention step.  ValueError when
    the working set alone exceeds the budget."""
    from hybridkv.cache.manager import CacheManager
    nbytes = {pk: layout.block_nbytes(*pk) for pk in layout.pool_keys()}
    working = CacheManager.pool_sizes(layout, max_tokens, max_running, every_n)
    used = sum(working[pk] * nbytes[pk] for pk in working)
    if used > budget:
        raise ValueError(f"budget {budget} B is below the working set of {max_running} "
                         f"request(s) of {max_tokens} tokens ({used} B)")
    step = every_n or layout.lcm
    kept = collections.Counter((s.kind, s.group) for s in layout.objects_at(2 * step, since=step))
    kept_bytes = sum(kept[pk] * nbytes[pk] for pk in kept)
    rest = budget - used
    sizes = {pk: working[pk] + (rest * kept[pk] // kept_bytes if kept[pk] else 0)
             for pk in layout.pool_keys()}
    # integer division can leave a block's worth over: trim the largest pools
    while sum(sizes[pk] * nbytes[pk] for pk in sizes) > budget:
        pk = max(sizes, key=lambda p: sizes[p] - working[p])
        sizes[pk] -= 1
    return sizes


def hybridkv_layout(pairing: str, cfg: dict) -> tuple:
    """(layout spec for hybridkv_side.make_layout, every_n) mirroring the vLLM config."""
    if pairing == "v4-mini":
        R = cfg["retention_interval"]
        return ({"preset": "v4-mini", "block_size": R, "window": cfg["sliding_window"],
                 "hca_ratio": min(128, R), "vocab": 32000}, R)
    if pairing == "full":
        return {"preset": "full", "block_size": cfg["block_size"]}, 0
    raise ValueError(f"pairing must be one of {PAIRINGS}: {pairing!r}")


def base_stream(name: str, args) -> dict:
    """The requests and the vLLM config (attention filled in per pairing)."""
    if name == "mooncake":
        stream = vllm_streams.mooncake_stream(args.trace, args.limit, args.decode_steps,
                                              "full", "serial", sliding_window=128,
                                              retention_interval=512, **VLLM_SHAPE)
    elif name == "decode":
        stream = vllm_streams.decode_stream(args.decode_requests, args.decode_len,
                                            sliding_window=128, retention_interval=512,
                                            **VLLM_SHAPE)
    elif name == "tiny":
        stream = vllm_streams.tiny_stream("full", "decode", decode_steps=20, **VLLM_SHAPE)
    else:
        raise ValueError(f"stream must be one of {STREAMS}: {name!r}")
    return stream


def make_job(name: str, pairing: str, stream: dict, budget: int, device: str) -> dict:
    """The stream of one job: the vLLM config (attention, num_blocks from the budget) plus the
    hybridkv section (layout, every_n, num_blocks from the same budget)."""
    from hybridkv.bench.hybridkv_side import make_layout
    cfg = {k: v for k, v in stream.items() if k != "requests"}
    cfg["attention"] = "full+swa" if pairing == "v4-mini" else "full"
    cfg["num_blocks"] = budget // vllm_block_bytes(cfg)
    spec, every_n = hybridkv_layout(pairing, cfg)
    layout = make_layout(spec)
    reqs = stream["requests"]
    max_tokens = max(len(r["prompt"]) + r["decode_steps"] for r in reqs)
    running = 1 if cfg["mode"] == "serial" else len(reqs)
    sizes = hybridkv_pool_sizes(layout, budget, every_n, max_tokens, running)
    hk = {"layout": spec, "every_n": every_n, "device": device, "guards": "on",
          "checked": False, "num_blocks": {f"{k}/{g}": n for (k, g), n in sizes.items()}}
    chain = [(pk, n) for pk, n in sizes.items() if pk[0] == "comp"]
    sizing = {
        "budget_bytes": budget,
        "vllm": {"block_bytes": vllm_block_bytes(cfg), "num_blocks": cfg["num_blocks"],
                 "bytes": cfg["num_blocks"] * vllm_block_bytes(cfg),
                 "groups": 2 if cfg["attention"] == "full+swa" else 1,
                 "tokens_if_one_group": cfg["num_blocks"] * cfg["block_size"]},
        "hybridkv": {"pools": hk["num_blocks"],
                     "block_bytes": {f"{k}/{g}": layout.block_nbytes(k, g) for k, g in sizes},
                     "bytes": sum(n * layout.block_nbytes(*pk) for pk, n in sizes.items()),
                     "chain_tokens": min(n * layout.group(g).block_size for (_, g), n in chain),
                     "working_set_for": {"max_tokens": max_tokens, "running": running}},
    }
    return {"stream": name, "pairing": pairing, "mode": cfg["mode"],
            "num_requests": len(reqs), "prompt_tokens": sum(len(r["prompt"]) for r in reqs),
            "decode_steps": sum(r["decode_steps"] for r in reqs),
            "file": {**cfg, "hybridkv": hk, "requests": reqs}, "sizing": sizing}


# -- processes --------------------------------------------------------------------------------
def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [vllm_streams.REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_hybridkv_side(stream_path: str, timeout_s: float = 600, footprint: bool = False) -> dict:
    """Run hybridkv_side on a stream in a fresh process of this python (this checkout first on
    PYTHONPATH); `footprint`: its bookkeeping-bytes pass instead of the timed replay.  Raises
    RuntimeError with stderr's tail on failure."""
    cmd = [sys.executable, "-m", "hybridkv.bench.hybridkv_side",
           *(["--footprint"] if footprint else []), stream_path]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=_env(), cwd=vllm_streams.REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"hybridkv_side exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def vllm_status() -> tuple:
    """(python or None, reason it is skipped or None): skipped when there is no vLLM python, or
    when it cannot import vllm."""
    python = vllm_streams.find_vllm_python()
    if python is not None:
        failure = vllm_streams.vllm_import_failure(python)
        return (python, None) if failure is None else (None, f"vLLM python unusable: {failure}")
    env = os.environ.get(vllm_streams.VLLM_PYTHON_ENV)
    where = (f"${vllm_streams.VLLM_PYTHON_ENV}={env!r} is not an executable file" if env else
             f"${vllm_streams.VLLM_PYTHON_ENV} is unset and "
             + os.path.join(os.path.dirname(vllm_streams.REPO_ROOT), "vllm-venv", "bin", "python")
             + " does not exist (scripts/vllm_venv creates it)")
    return None, f"no vLLM python: {where}"


def measure_footprint(job: dict, python, timeout_s: float, log, errors: list) -> dict:
    """{side: its footprint summary, "ratios"}: one untimed ``--footprint`` process per side
    (vLLM's only with a ``python``), errors appended to ``errors``."""
    out = {}
    for side in ("hybridkv", "vllm") if python else ("hybridkv",):
        t0 = time.perf_counter()
        try:
            out[side] = (run_hybridkv_side(job["path"], timeout_s, footprint=True)
                         if side == "hybridkv" else
                         vllm_streams.run_vllm_side(python, job["path"], timeout_s,
                                                    footprint=True))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
            errors.append({"footprint": True, "stream": job["stream"],
                           "pairing": job["pairing"], "side": side, "error": str(e)[-2000:]})
            log(f"footprint {job['stream']}/{job['pairing']} {side}: FAILED {e}")
            continue
        log(f"footprint {job['stream']}/{job['pairing']} {side}: "
            f"{time.perf_counter() - t0:.1f}s")
    if "hybridkv" in out and "vllm" in out:
        out["ratios"] = footprint_ratios(out["hybridkv"], out["vllm"])
    return out


def footprint_ratios(hk: dict, vl: dict) -> dict:
    """hybridkv / vLLM of the bookkeeping bytes per block after construction and after the
    stream, and of the bytes held after the stream (the same KV budget on both sides)."""
    return {"built_per_block": _ratio(hk["built_per_block"], vl["built_per_block"]),
            "stream_per_block": _ratio(hk["stream_per_block"], vl["stream_per_block"]),
            "stream_bytes": _ratio(hk["stream_bytes"], vl["stream_bytes"])}


# -- aggregation ------------------------------------------------------------------------------
def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def median_timings(results: list) -> dict:
    """call type -> {count, p50, p99}: the median over rounds of each round's p50 and p99."""
    out = {}
    for name in results[0]["timings_us"]:
        rows = [r["timings_us"][name] for r in results]
        out[name] = {"count": rows[0]["count"], "p50": _median([t["p50"] for t in rows]),
                     "p99": _median([t["p99"] for t in rows]),
                     "p50_rounds": [t["p50"] for t in rows]}
    return out


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def ratio_table(hk: dict, vl: dict) -> dict:
    table = {}
    for row, hname, vname in RATIO_ROWS:
        h, v = hk.get(hname), vl.get(vname)
        if not h or not v or h["count"] == 0 or v["count"] == 0:
            continue
        table[row] = {"hybridkv_p50": h["p50"], "vllm_p50": v["p50"],
                      "ratio_p50": _ratio(h["p50"], v["p50"]),
                      "hybridkv_p99": h["p99"], "vllm_p99": v["p99"],
                      "ratio_p99": _ratio(h["p99"], v["p99"])}
    return table


def whole_stream(hk_results: list, vl_results: list) -> dict:
    """The ratio table's whole-stream row from each side's rounds: the median over rounds of
    ``stream_s`` (the replay's wall time: every request of the stream served, the manager's
    construction excluded on both sides, hybridkv's measurement-only hashing pass taken out),
    ratio hybridkv / vLLM (< 1: hybridkv faster)."""
    hk_s = [r["stream_s"] for r in hk_results]
    vl_s = [r["stream_s"] for r in vl_results]
    hk_med, vl_med = statistics.median(hk_s), statistics.median(vl_s)
    return {"hybridkv_s": round(hk_med, 6), "vllm_s": round(vl_med, 6),
            "ratio": _ratio(hk_med, vl_med), "hybridkv_s_rounds": hk_s, "vllm_s_rounds": vl_s}


def ratios(job: dict) -> list:
    """(row, ratio) of one job's ratio table: every call type's p50 ratio, then the whole
    stream's (the ratio of the median replay walls); empty without both sides."""
    rows = [(row, r["ratio_p50"]) for row, r in job.get("ratios", {}).items()]
    if "whole_stream" in job:
        rows.append((WHOLE_STREAM_ROW, job["whole_stream"]["ratio"]))
    return rows


def hits_of(result: dict) -> dict:
    h = result["hits"]
    return {"hit_rate": h["hit_rate"], "hit_tokens": h["hit_tokens"],
            "prompt_tokens": h["prompt_tokens"], "lookups": h["lookups"],
            "refused_prefill": result["refused"]["prefill"],
            "refused_decode": result["refused"]["decode"]}


# -- the run ----------------------------------------------------------------------------------
def run(args, log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> dict:
    t_start = time.perf_counter()
    budget = int(args.budget_mib * 2 ** 20)
    python, skipped = vllm_status()
    if skipped:
        log(f"vLLM skipped: {skipped}")
    out = {"rounds": args.rounds, "budget_bytes": budget, "device": args.device,
           "streams": list(args.streams), "pairings": list(args.pairings),
           "vllm": {"python": python, "skipped": skipped, "version": None},
           "jobs": [], "errors": []}
    with tempfile.TemporaryDirectory(prefix="vs-vllm-", dir=args.workdir) as tmp:
        jobs = []
        for name in args.streams:
            stream = base_stream(name, args)
            job_budget = budget if name != "tiny" else min(budget, 400 * 4096)
            for pairing in args.pairings:
                job = make_job(name, pairing, stream, job_budget, args.device)
                path = os.path.join(tmp, f"{name}-{pairing}.json")
                vllm_streams.write_stream(path, job.pop("file"))
                job["path"] = path
                jobs.append(job)
            del stream
        log(f"{len(jobs)} jobs x {args.rounds} rounds"
            + ("" if skipped else " x (hybridkv, vLLM)"))
        results = {id(j): {"hybridkv": [], "vllm": []} for j in jobs}
        for i in range(args.rounds):
            for job in jobs:
                sides = ["hybridkv", "vllm"] if i % 2 == 0 else ["vllm", "hybridkv"]
                for side in sides:
                    if side == "vllm" and skipped:
                        continue
                    t0 = time.perf_counter()
                    try:
                        res = (run_hybridkv_side(job["path"], args.timeout) if side == "hybridkv"
                               else vllm_streams.run_vllm_side(python, job["path"], args.timeout))
                    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                        out["errors"].append({"round": i, "stream": job["stream"],
                                              "pairing": job["pairing"], "side": side,
                                              "error": str(e)[-2000:]})
                        log(f"round {i} {job['stream']}/{job['pairing']} {side}: FAILED {e}")
                        continue
                    results[id(job)][side].append(res)
                    log(f"round {i} {job['stream']}/{job['pairing']} {side}: "
                        f"{time.perf_counter() - t0:.1f}s (replay {res['wall_s']:.2f}s)")
        for job in jobs:
            res = results[id(job)]
            entry = {k: v for k, v in job.items() if k != "path"}
            for side in ("hybridkv", "vllm"):
                if res[side]:
                    rates = {r["hits"]["hit_rate"] for r in res[side]}
                    entry[side] = {"timings_us": median_timings(res[side]),
                                   "hits": hits_of(res[side][0]),
                                   "hit_rate_same_every_round": len(rates) == 1,
                                   "rounds": len(res[side]),
                                   "replay_wall_s": [r["wall_s"] for r in res[side]],
                                   "stream_s": [r["stream_s"] for r in res[side]]}
            if res["vllm"]:
                out["vllm"]["version"] = res["vllm"][0]["vllm_version"]
            if res["hybridkv"] and res["vllm"]:
                entry["ratios"] = ratio_table(entry["hybridkv"]["timings_us"],
                                              entry["vllm"]["timings_us"])
                entry["whole_stream"] = whole_stream(res["hybridkv"], res["vllm"])
            if args.footprint:
                entry["footprint"] = measure_footprint(job, None if skipped else python,
                                                       args.timeout, log, out["errors"])
            out["jobs"].append(entry)
        if args.extras:
            t0 = time.perf_counter()
            main_job = next((j for j in jobs if j["stream"] == "mooncake"
                             and j["pairing"] == "v4-mini"), jobs[0])
            out["extras"] = run_extras(main_job["path"], args, budget, tmp, log, out["errors"])
            log(f"extras: {time.perf_counter() - t0:.1f}s")
    out["ratio_table"] = [{"stream": j["stream"], "pairing": j["pairing"], "row": row,
                           "ratio_p50": ratio} for j in out["jobs"] for row, ratio in ratios(j)]
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    return out


# -- hybridkv-only extras ---------------------------------------------------------------------
def _stat(results, key):
    return _median([key(r) for r in results])


def run_extras(main_path: str, args, budget: int, tmp: str, log, errors: list) -> dict:
    """Hybridkv-only measurements, every one a pair of hybridkv_side processes run in
    interleaved rounds (the order flipped every other round), like the main comparison:
      guards    the main job's stream (mooncake / v4-mini by default) through two managers in
                lockstep in one process (hybridkv_side.PairedDriver), every call made with the
                spec guards on and with every guard stubbed to True back to back, so the load
                noise of a shared machine falls on both: overhead = timed call time on /
                stubbed - 1, median over rounds; round 0 also times allocate(rid, 10**9) on the
                guards-on cache the stream left (refusal);
      checked   its first --checked-limit requests, checked mode on vs off;
      context   one request, decode mode, a short vs a long prompt (2048 / 65536 tokens, 256
                decode steps), in the main job's layout and in the full layout: decode_step p50
                long / short (at least 5 rounds: one step is a few microseconds)."""
    from hybridkv.bench.hybridkv_side import make_layout
    with open(main_path) as f:
        base = json.load(f)
    hk = base["hybridkv"]
    files = {}

    def put(name, stream):
        files[name] = os.path.join(tmp, f"extra-{name}.json")
        vllm_streams.write_stream(files[name], stream)
    put("guards", dict(base, hybridkv=dict(hk, guards="paired",
                                           refusal_reps=args.refusal_reps)))
    small = dict(base, requests=base["requests"][:args.checked_limit])
    put("checked-on", dict(small, hybridkv=dict(hk, checked=True)))
    put("checked-off", small)
    short, long_, steps = args.context
    layouts = {hk["layout"]["preset"]: (hk["layout"], hk["every_n"]),
               "full": ({"preset": "full", "block_size": 16}, 0)}
    for preset, (spec, every_n) in layouts.items():
        sizes = hybridkv_pool_sizes(make_layout(spec), budget, every_n, long_ + steps, 1)
        h = dict(hk, layout=spec, every_n=every_n, refusal_reps=0,
                 num_blocks={f"{k}/{g}": n for (k, g), n in sizes.items()})
        for n in (short, long_):
            reqs = vllm_streams.decode_stream(1, steps, n, 0, seed=n)["requests"]
            put(f"context-{preset}-{n}", {"mode": "decode", "hybridkv": h, "requests": reqs})
    del base, small
    plan = [(["guards"], args.rounds), (["checked-on", "checked-off"], args.rounds)]
    plan += [([f"context-{p}-{short}", f"context-{p}-{long_}"],
              max(args.rounds, getattr(args, "context_min_rounds", 5))) for p in layouts]
    res = {name: [] for name in files}
    for names, rounds in plan:
        t0 = time.perf_counter()
        for i in range(rounds):
            for name in (names if i % 2 == 0 else names[::-1]):
                try:
                    res[name].append(run_hybridkv_side(files[name], args.timeout))
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                    errors.append({"extra": name, "round": i, "error": str(e)[-2000:]})
                    log(f"extra {name} round {i}: FAILED {e}")
        log(f"extras {' / '.join(names)}: {rounds} rounds, {time.perf_counter() - t0:.1f}s")
    out = {"stream": files["guards"], "rounds": args.rounds}
    calls = ("lookup", "prefill_allocate", "prefill_commit", "prefill", "decode_step", "free")

    def p50(name, call):
        return _stat(res[name], lambda r: r["timings_us"][call]["p50"])
    g = res["guards"]
    if g:
        out["guards"] = {
            "overhead": _median([r["overhead"] for r in g]),
            "overhead_rounds": [round(r["overhead"], 4) for r in g],
            "timed_s_rounds": [r["timed_s"] for r in g],
            "overhead_per_call_type": {c: _median([r["overhead_per_call_type"].get(c)
                                                   for r in g])
                                       for c in g[0]["overhead_per_call_type"]},
            "p50_us": {m: {c: _median([r["p50_us"][m][c] for r in g]) for c in calls}
                       for m in ("on", "stubbed")},
            "same_hits": all(r["hits"]["on"] == r["hits"]["stubbed"] for r in g),
            "hit_tokens": g[0]["hits"]["on"]}
        out["refusal"] = g[0].get("refusal", [])
    c_on, c_off = res["checked-on"], res["checked-off"]
    if c_on and c_off:
        a_s, b_s = _stat(c_on, lambda r: r["timed_s"]), _stat(c_off, lambda r: r["timed_s"])
        out["checked"] = {
            "requests": c_on[0]["hits"]["lookups"], "ratio": round(a_s / b_s, 3),
            "on_timed_s": a_s, "off_timed_s": b_s,
            "p50_ratio_on_over_off": {c: _ratio(p50("checked-on", c), p50("checked-off", c))
                                      for c in calls}}
    out["context"] = []
    for p in layouts:
        s_name, l_name = f"context-{p}-{short}", f"context-{p}-{long_}"
        if not (res[s_name] and res[l_name]):
            continue
        sp, lp = p50(s_name, "decode_step"), p50(l_name, "decode_step")
        out["context"].append({
            "layout": p, "short": short, "long": long_, "steps": steps,
            "rounds": len(res[s_name]), "short_p50": sp, "long_p50": lp, "ratio": _ratio(lp, sp),
            "short_p99": _stat(res[s_name], lambda r: r["timings_us"]["decode_step"]["p99"]),
            "long_p99": _stat(res[l_name], lambda r: r["timings_us"]["decode_step"]["p99"]),
            "p50_rounds": {str(short): [r["timings_us"]["decode_step"]["p50"]
                                        for r in res[s_name]],
                           str(long_): [r["timings_us"]["decode_step"]["p50"]
                                        for r in res[l_name]]}})
    return out


# -- text report ------------------------------------------------------------------------------
def _fmt(v, width=9):
    return f"{'-':>{width}}" if v is None else f"{v:>{width}.1f}"


def footprint_lines(fp) -> list:
    """The report's lines for one job's footprint (none when it was skipped)."""
    if not fp:
        return []
    lines = ["   bookkeeping bytes per block (Python heap; after construction / after the "
             "stream):"]
    for side, name in (("hybridkv", "hybridkv"), ("vllm", "vLLM")):
        f = fp.get(side)
        if f:
            added = f["added_per_cached_block"]
            lines.append(f"     {name:8s} {f['built_per_block']:>8.1f} / "
                         f"{f['stream_per_block']:>8.1f} B  ({f['num_blocks']} blocks, "
                         f"{f['cached_blocks']} cached after the stream: "
                         f"{'-' if added is None else f'+{added:.1f}'} B each; "
                         f"{f['stream_bytes'] / 2**20:.2f} MiB held)")
    r = fp.get("ratios")
    if r:
        lines.append(f"     ratio    {r['built_per_block']:>8.3f} / {r['stream_per_block']:>8.3f}"
                     f"    per block; {r['stream_bytes']:.3f} of the bytes held after the "
                     f"stream (same KV budget)")
    return lines


def report(out: dict) -> str:
    lines = [f"hybridkv vs vLLM {out['vllm']['version'] or ''}: median over {out['rounds']} "
             f"rounds of per-round p50/p99 (us); budget {out['budget_bytes'] / 2**20:.0f} MiB "
             f"per side"]
    if out["vllm"]["skipped"]:
        lines.append(f"vLLM skipped: {out['vllm']['skipped']}")
    for j in out["jobs"]:
        lines.append("")
        lines.append(f"== {j['stream']} ({j['mode']}, {j['num_requests']} requests, "
                     f"{j['prompt_tokens']} prompt tokens, {j['decode_steps']} decode steps) "
                     f"pairing {j['pairing']}")
        sz = j["sizing"]
        lines.append(f"   sizing: vLLM {sz['vllm']['num_blocks']} blocks x "
                     f"{sz['vllm']['block_bytes']} B; hybridkv {sz['hybridkv']['bytes']} B in "
                     f"{len(sz['hybridkv']['pools'])} pools (chain capacity "
                     f"{sz['hybridkv']['chain_tokens']} tokens)")
        hk, vl = j.get("hybridkv"), j.get("vllm")
        for side, s in (("hybridkv", hk), ("vLLM", vl)):
            if s:
                h = s["hits"]
                lines.append(f"   {side:8s} hit rate {h['hit_rate']:.4f} ({h['hit_tokens']}/"
                             f"{h['prompt_tokens']} tokens), refused prefill "
                             f"{h['refused_prefill']} decode {h['refused_decode']}")
        lines.append(f"   {'call type':48s} {'hk p50':>9} {'hk p99':>9} {'vLLM p50':>9} "
                     f"{'vLLM p99':>9} {'p50 ratio':>9}")
        if hk and vl:
            for row, r in j["ratios"].items():
                lines.append(f"   {row:48s} {_fmt(r['hybridkv_p50'])} {_fmt(r['hybridkv_p99'])} "
                             f"{_fmt(r['vllm_p50'])} {_fmt(r['vllm_p99'])} "
                             f"{r['ratio_p50']:>9.3f}")
            w = j["whole_stream"]
            lines.append(f"   {WHOLE_STREAM_ROW + ', s (median of rounds)':48s} "
                         f"{w['hybridkv_s']:>9.4f} {'':>9} {w['vllm_s']:>9.4f} {'':>9} "
                         f"{w['ratio']:>9.3f}")
        elif hk:
            for name, t in hk["timings_us"].items():
                lines.append(f"   {name:48s} {_fmt(t['p50'])} {_fmt(t['p99'])}")
        lines.extend(footprint_lines(j.get("footprint")))
    ex = out.get("extras")
    if ex:
        lines.append("")
        lines.append("hybridkv only (median over rounds; stream "
                     f"{os.path.basename(ex['stream'])}):")
        for c in ex["context"]:
            lines.append(f"  decode p50 at {c['long']} vs {c['short']} tokens ({c['layout']}, "
                         f"{c['rounds']} rounds): {c['long_p50']:.2f} / {c['short_p50']:.2f} us "
                         f"= {c['ratio']:.3f} (goal <= 1.5)")
        g = ex.get("guards")
        if g:
            lines.append(f"  guard overhead (on / stubbed - 1, timed call time, lockstep): "
                         f"{g['overhead']:+.3f} (rounds {g['overhead_rounds']}; goal <= +0.10);"
                         f" same hits: {g['same_hits']}")
        c = ex.get("checked")
        if c:
            lines.append(f"  checked mode on / off ({c['requests']} requests, timed call "
                         f"time): {c['ratio']:.2f}x")
        for r in ex.get("refusal", []):
            lines.append(f"  allocate(rid, 10**9) on a {r['state']} request: refused "
                         f"({r['error']}) p50 {r['p50_us']:.1f} us, max {r['max_us']:.1f} us; "
                         f"nothing allocated: {r['unchanged']} (goal < 1000 us)")
    for e in out["errors"]:
        lines.append(f"ERROR {e}")
    lines.append(f"wall {out['wall_s']} s")
    return "\n".join(lines)
