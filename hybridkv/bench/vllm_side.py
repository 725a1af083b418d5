"""The vLLM side of the side-by-side benchmark: drive vLLM's own `KVCacheManager` over a request
stream and time every call.

STANDALONE: imports only the stdlib, torch and vllm. It runs under the separate vLLM virtual
environment (`scripts/vllm_venv`) by file path, never as part of the hybridkv package:

    <vllm-python> hybridkv/bench/vllm_side.py STREAM.json     # one JSON object on stdout
    <vllm-python> hybridkv/bench/vllm_side.py --footprint STREAM.json   # bookkeeping bytes only

STREAM.json (write one with `python -m hybridkv.bench.vllm_streams`):

    {"attention": "full" | "full+swa", "block_size": 16, "sliding_window": 128,
     "retention_interval": 512, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16",
     "num_blocks": 20000, "max_model_len": 200000, "mode": "serial" | "decode",
     "requests": [{"id": "r0", "prompt": [int, ...], "decode_steps": 4}, ...], "warmup": 0}

Optional keys: "hash_algo" (default "sha256", the engine default), "max_in_flight_tokens"
(default 8192).

One scheduler step is simulated the way vLLM's `Scheduler.schedule` drives the manager:
`new_step_starts()` (timed apart), then for an admission `get_computed_blocks` ->
`allocate_slots(req, uncached, num_new_computed_tokens=hit, new_computed_blocks=blocks)`, and the
scheduler's own bookkeeping the manager relies on (status RUNNING, `num_computed_tokens`,
`shared_prefix_boundary`, `record_prefix_cache_stats`); for a decode step
`append_output_token_ids(tok)` -> `allocate_slots(req, 1)` -> `num_computed_tokens += 1`.

Timed call types (microseconds, `time.perf_counter_ns`):
  lookup                 Request(...) construction (prompt hashing) + get_computed_blocks
  lookup_excl_hash       get_computed_blocks alone
  prefill_allocate       allocate_slots for the uncached rest of the prompt
  decode_step            append_output_token_ids (hashes a block when one fills) + allocate_slots(1)
  decode_step_excl_hash  allocate_slots(1) alone
  decode_step_first      decode_step of a request's first decode step only: with a sliding-window
                         group, that allocate_slots frees the prompt's out-of-window blocks
                         (remove_skipped_blocks), which the prefill allocation did not
  decode_step_later      decode_step of every later decode step
  free                   free
  new_step_starts        new_step_starts (outside every region above)

A request whose allocation is refused (allocate_slots returns None) is counted, freed (its free is
not timed) and skipped from then on.

Whole stream:
  wall_s / stream_s  the replay's wall time: every call above (new_step_starts included) plus the
                     driver's own work (clock reads, sample lists, the scheduler's bookkeeping,
                     SamplingParams(...) per request, ~6 us); the manager's construction is not in
                     it (setup_s).  Nothing in it is measurement only, so stream_s = wall_s
                     (hybridkv_side's stream_s drops its extra hashing pass)
"""
import gc
import json
import os
import platform
import sys
import time
import tracemalloc

# sys.path[0] is this file's folder, and the repo root may be on the path too (PYTHONPATH, or ''
# when run from there): our `kernels/` package would shadow the `kernels` package that transformers
# probes for, and our bench modules could shadow others. Drop both before importing vllm.
_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path[:] = [p for p in sys.path
               if os.path.abspath(p or os.getcwd()) not in (_HERE, _REPO)]
# vLLM logs to stdout by default; this script's stdout carries exactly one JSON object.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, SlidingWindowSpec)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

VOCAB = 32_000
CALL_TYPES = ("lookup", "lookup_excl_hash", "prefill_allocate", "decode_step",
              "decode_step_excl_hash", "decode_step_first", "decode_step_later", "free",
              "new_step_starts")
DEFAULTS = {"attention": "full", "block_size": 16, "sliding_window": 128,
            "retention_interval": 0, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16",
            "num_blocks": 20000, "max_model_len": 200000, "mode": "serial", "warmup": 0,
            "hash_algo": "sha256", "max_in_flight_tokens": 8192}


def load_stream(path):
    """Read STREAM.json and fill defaults. Raises ValueError on a malformed stream."""
    with open(path) as f:
        stream = json.load(f)
    config = dict(DEFAULTS)
    config.update({k: v for k, v in stream.items() if k != "requests"})
    if config["attention"] not in ("full", "full+swa"):
        raise ValueError(f"attention must be 'full' or 'full+swa': {config['attention']!r}")
    if config["mode"] not in ("serial", "decode"):
        raise ValueError(f"mode must be 'serial' or 'decode': {config['mode']!r}")
    requests = stream.get("requests")
    if not isinstance(requests, list):
        raise ValueError("requests must be a list")
    seen = set()
    for r in requests:
        if not r.get("prompt"):
            raise ValueError(f"request {r.get('id')!r} has an empty prompt")
        if r["id"] in seen:
            raise ValueError(f"duplicate request id {r['id']!r}")
        seen.add(r["id"])
        r.setdefault("decode_steps", 0)
    if not 0 <= config["warmup"] <= len(requests):
        raise ValueError(f"warmup must be in [0, {len(requests)}]: {config['warmup']!r}")
    return config, requests


def build_manager(config):
    """A KVCacheManager as the engine would build it for this config, plus the block hasher that
    Request(...) and append_output_token_ids use. Returns (manager, hasher, retention_used)."""
    block_size = config["block_size"]
    dtype = getattr(torch, config["dtype"])
    shape = dict(block_size=block_size, num_kv_heads=config["num_kv_heads"],
                 head_size=config["head_size"], dtype=dtype)
    groups = [KVCacheGroupSpec(["layers.0"], FullAttentionSpec(**shape))]
    retention = config["retention_interval"]
    if config["attention"] == "full+swa":
        groups.append(KVCacheGroupSpec(
            ["layers.1"], SlidingWindowSpec(**shape, sliding_window=config["sliding_window"])))
    elif retention:
        # vLLM rejects a retention interval when no sliding-window/Mamba group exists: it only
        # sparsifies those groups' checkpoints. Full attention caches densely either way.
        retention = 0
    kv_cache_config = KVCacheConfig(num_blocks=config["num_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=groups,
                                    prefix_cache_retention_interval=retention)
    hash_fn = get_hash_fn_by_name(config["hash_algo"])
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(block_size, hash_fn)
    manager = KVCacheManager(kv_cache_config, max_model_len=config["max_model_len"],
                             scheduler_block_size=block_size, hash_block_size=block_size,
                             max_in_flight_tokens=config["max_in_flight_tokens"],
                             enable_caching=True, log_stats=True)
    return manager, hasher, retention


class Driver:
    """Plays the scheduler's part for one manager: steps, admissions, decode steps, frees; records
    per-call times (ns) and hit/refusal counts."""

    def __init__(self, manager, hasher):
        self.manager = manager
        self.hasher = hasher
        self.times_ns = {name: [] for name in CALL_TYPES}
        self.num_lookups = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.shared_prefix_boundaries = 0
        self.refused_prefill = 0
        self.refused_decode = 0
        self.refused_ids = []

    def step(self):
        """Start a scheduler step."""
        t0 = time.perf_counter_ns()
        self.manager.new_step_starts()
        self.times_ns["new_step_starts"].append(time.perf_counter_ns() - t0)

    def admit(self, spec):
        """Look up and prefill-allocate one request in its own step. Returns the Request, or None
        when the allocation was refused (the request is then freed)."""
        prompt = spec["prompt"]
        params = SamplingParams(max_tokens=max(1, spec["decode_steps"] + 1))
        self.step()
        t0 = time.perf_counter_ns()
        request = Request(spec["id"], prompt, params, None, arrival_time=0.0,
                          block_hasher=self.hasher)
        t1 = time.perf_counter_ns()
        blocks, num_hit, boundary = self.manager.get_computed_blocks(request)
        t2 = time.perf_counter_ns()
        self.times_ns["lookup"].append(t2 - t0)
        self.times_ns["lookup_excl_hash"].append(t2 - t1)
        self.num_lookups += 1
        self.prompt_tokens += len(prompt)
        self.hit_tokens += num_hit
        self.shared_prefix_boundaries += boundary > 0
        # What the scheduler does with the lookup (the manager reads these later).
        request.shared_prefix_boundary = boundary
        num_new = len(prompt) - num_hit
        t0 = time.perf_counter_ns()
        allocated = self.manager.allocate_slots(request, num_new, num_new_computed_tokens=num_hit,
                                                new_computed_blocks=blocks)
        self.times_ns["prefill_allocate"].append(time.perf_counter_ns() - t0)
        if allocated is None:
            self.refused_prefill += 1
            self.refused_ids.append(spec["id"])
            self.manager.free(request)
            return None
        self.manager.record_prefix_cache_stats(request, num_hit)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit + num_new
        return request

    def decode(self, request, token):
        """One decode step of `request` (the caller starts the step). Returns False when the
        allocation was refused (the request is then freed)."""
        t0 = time.perf_counter_ns()
        request.append_output_token_ids(token)
        t1 = time.perf_counter_ns()
        allocated = self.manager.allocate_slots(request, 1)
        t2 = time.perf_counter_ns()
        self.times_ns["decode_step"].append(t2 - t0)
        self.times_ns["decode_step_excl_hash"].append(t2 - t1)
        first = request.num_output_tokens == 1
        self.times_ns["decode_step_first" if first else "decode_step_later"].append(t2 - t0)
        if allocated is None:
            self.refused_decode += 1
            self.refused_ids.append(request.request_id)
            request.status = RequestStatus.FINISHED_ABORTED
            self.manager.free(request)
            return False
        request.num_computed_tokens += 1
        return True

    def free(self, request):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        t0 = time.perf_counter_ns()
        self.manager.free(request)
        self.times_ns["free"].append(time.perf_counter_ns() - t0)


def decode_token(spec, step):
    return (spec["prompt"][-1] + step) % VOCAB


def run_serial(driver, specs):
    """Requests one after another: admit, decode_steps steps, free."""
    for spec in specs:
        request = driver.admit(spec)
        if request is None:
            continue
        alive = True
        for step in range(spec["decode_steps"]):
            driver.step()
            alive = driver.decode(request, decode_token(spec, step))
            if not alive:
                break
        if alive:
            driver.free(request)


def run_decode(driver, specs):
    """Admit every request (one step each), then rounds in which every live request takes one
    decode step (one step per round), then free all."""
    live = []
    for spec in specs:
        request = driver.admit(spec)
        if request is not None:
            live.append((spec, request))
    rounds = max((spec["decode_steps"] for spec, _ in live), default=0)
    for step in range(rounds):
        driver.step()
        survivors = []
        for spec, request in live:
            if step >= spec["decode_steps"] or driver.decode(request, decode_token(spec, step)):
                survivors.append((spec, request))
        live = survivors
    for _, request in live:
        driver.free(request)


def summarize(samples_ns):
    """count, p50, p99, mean, max in microseconds (nearest-rank percentiles).  This script
    imports nothing of ours, so this is the twin of hybridkv.bench.percentile.summarize; a test
    (tests/bench/test_vllm_side.py) keeps the two equal."""
    if not samples_ns:
        return {"count": 0, "p50": None, "p99": None, "mean": None, "max": None}
    s = sorted(samples_ns)
    n = len(s)

    def rank(q):
        return s[min(n - 1, max(0, -(-q * n // 100) - 1))] / 1000

    return {"count": n, "p50": round(rank(50), 3), "p99": round(rank(99), 3),
            "mean": round(sum(s) / n / 1000, 3), "max": round(s[-1] / 1000, 3)}


class HeapMeter:
    """``with HeapMeter() as meter: ... meter.held()``: bytes of Python heap allocated since the
    ``with`` began and still live, after gc.collect().  This script imports nothing of ours, so
    this is the twin of hybridkv.bench.footprint.HeapMeter (tests/bench/test_footprint.py keeps
    the two equal)."""

    def __init__(self):
        self.base = 0           # traced bytes when the with began

    def __enter__(self):
        gc.collect()
        tracemalloc.start()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def held(self) -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - self.base

    def __exit__(self, *exc):
        tracemalloc.stop()


def footprint_summary(num_blocks, cached_blocks, built, stream):
    """The twin of hybridkv.bench.footprint.summary (held equal by the same test)."""
    return {"num_blocks": num_blocks, "cached_blocks": cached_blocks,
            "built_bytes": built, "stream_bytes": stream,
            "built_per_block": round(built / num_blocks, 1),
            "stream_per_block": round(stream / num_blocks, 1),
            "added_per_cached_block": round((stream - built) / cached_blocks, 1)
            if cached_blocks else None}


def footprint(config, requests):
    """The manager's bookkeeping bytes per block, as hybridkv.bench.footprint counts them: a
    manager built and the stream replayed under tracemalloc, after a throwaway manager served
    the first two requests.  Counted: every Python object the KVCacheManager made and holds
    (its KVCacheBlock objects, the free queue, the hash -> block map, the per-group managers,
    the block hasher); it holds no tensors (kv_cache_tensors=[]).  Untimed."""
    runner = run_serial if config["mode"] == "serial" else run_decode
    manager, hasher, _ = build_manager(config)
    runner(Driver(manager, hasher), [dict(r, id=f"warmup-{r['id']}") for r in requests[:2]])
    del manager, hasher
    with HeapMeter() as meter:
        manager, hasher, _ = build_manager(config)
        built = meter.held()
        runner(Driver(manager, hasher), requests)
        stream = meter.held()
    blocks = manager.block_pool.blocks
    cached = sum(1 for b in blocks if b.block_hash is not None)
    return {"side": "vllm", **footprint_summary(len(blocks), cached, built, stream)}


def stats_dict(stats):
    if stats is None:
        return None
    return {k: v for k, v in vars(stats).items() if isinstance(v, (int, float, bool))}


def run(config, requests):
    runner = run_serial if config["mode"] == "serial" else run_decode
    if config["warmup"]:
        # Warm the code paths on a throwaway manager so the measured cache state and hit
        # statistics see only the measured requests.
        manager, hasher, _ = build_manager(config)
        warm = [dict(r, id=f"warmup-{r['id']}") for r in requests[:config["warmup"]]]
        runner(Driver(manager, hasher), warm)
        del manager, hasher, warm
    t0 = time.perf_counter()
    manager, hasher, retention = build_manager(config)
    setup_s = time.perf_counter() - t0
    driver = Driver(manager, hasher)
    gc.collect()
    gc.freeze()   # as vLLM's EngineCore does after start-up (freeze_gc_heap)
    t0 = time.perf_counter()
    runner(driver, requests)
    wall_s = time.perf_counter() - t0
    vllm_stats = stats_dict(manager.make_prefix_cache_stats())
    return {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "config": dict(config, retention_interval_used=retention,
                       num_requests=len(requests),
                       total_decode_steps=sum(r["decode_steps"] for r in requests)),
        "setup_s": round(setup_s, 4),
        "wall_s": round(wall_s, 4),
        "stream_s": round(wall_s, 6),
        "timings_us": {name: summarize(driver.times_ns[name]) for name in CALL_TYPES},
        "hits": {
            "lookups": driver.num_lookups,
            "prompt_tokens": driver.prompt_tokens,
            "hit_tokens": driver.hit_tokens,
            "hit_rate": round(driver.hit_tokens / driver.prompt_tokens, 6)
            if driver.prompt_tokens else 0.0,
            "shared_prefix_boundaries": driver.shared_prefix_boundaries,
            "vllm_prefix_cache_stats": vllm_stats,
        },
        "refused": {"prefill": driver.refused_prefill, "decode": driver.refused_decode,
                    "request_ids": driver.refused_ids[:50]},
        "final": {"free_blocks": manager.block_pool.get_num_free_blocks(),
                  "usage": round(manager.usage, 6)},
    }


def main(argv):
    args = argv[1:]
    measure = footprint if args[:1] == ["--footprint"] else run
    if len(args) != 1 + (measure is footprint):
        print(f"usage: {argv[0]} [--footprint] STREAM.json", file=sys.stderr)
        return 2
    # Anything a library prints goes to stderr; the saved stdout gets the one JSON object.
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    config, requests = load_stream(args[-1])
    result = measure(config, requests)
    out.write(json.dumps(result) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    status = main(sys.argv)
    sys.stderr.flush()
    # Skip interpreter teardown: triton (imported by vllm) prints nanobind leak reports there.
    os._exit(status)
