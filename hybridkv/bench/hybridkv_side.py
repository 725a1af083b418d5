"""The hybridkv side of the side-by-side benchmark: drive hybridkv's `CacheManager` over the same
request stream `vllm_side.py` reads, and time every call the same way.

Run in its own process with the main environment's python (the runner sets PYTHONPATH to this
checkout), like `vllm_side.py` under the vLLM one:

    python -m hybridkv.bench.hybridkv_side STREAM.json      # one JSON object on stdout
    python -m hybridkv.bench.hybridkv_side --footprint STREAM.json   # bookkeeping bytes only

STREAM.json is the file `vllm_streams` writes (the vLLM keys are read for the mode and the
requests only) plus a "hybridkv" object (`vs_vllm` writes it):

    {"layout": {"preset": "v4-mini" | "full", ...keyword arguments of ModelLayout.v4_mini /
                ModelLayout.full},
     "num_blocks": int | {"kind/group": int, ...}, "every_n": 512, "device": "cpu" | "meta",
     "guards": "on" | "stubbed" | "paired", "checked": false, "warmup": 0, "refusal_reps": 0}

"guards": "paired" measures the guard overhead instead (PairedDriver: two managers in lockstep,
guards on vs stubbed call by call) and prints {"overhead", "timed_s", "p50_us", ...}.

With "refusal_reps": N > 0, after the replay `allocate(rid, 10**9)` is timed N times on the cache
the stream left behind, on a looked-up request and on a running one (`measure_refusal`).

The flow per request is the API's (API_BRIEF): the prompt arrives (`CheckedTokens`: its ids
checked once, as vLLM's Request is built once with its block hashes), `lookup` of it (hashing
and the funnel: hybridkv hashes inside its lookup), the prefill `allocate(rid, n)` of the
uncached rest, then its commits, each ending on a checkpoint the allocation returned; a decode
step is `allocate(rid, 1)` + `commit(rid, 1, [tok])` (the same token `vllm_side.decode_token`
appends); `free`. Serial and decode modes schedule requests exactly as `vllm_side.py` does.

Timed call types (microseconds, `time.perf_counter_ns`):
  lookup             the arrival check (CheckedTokens: the ids checked and packed as int64
                     words once) + lookup (hashing included)
  lookup_hash        the prompt's chain hashing alone (`extend_chain` over the packed words,
                     run again outside the timed lookup): what `lookup` spends hashing
  lookup_excl_hash   the lookup call - lookup_hash of the same request, the arrival check left
                     out as vLLM's Request construction is (an estimate: compare with vLLM's
                     `get_computed_blocks` alone)
  prefill_allocate   the prefill allocate alone
  prefill_commit     the prefill's commits (publish, seal, snapshot capture, window slide)
  prefill            prefill_allocate + prefill_commit (vLLM's allocate_slots also caches the
                     prompt's full blocks: the work hybridkv splits over allocate and commit)
  decode_step        allocate(rid, 1) + commit(rid, 1, [tok])
  decode_step_first  decode_step of a request's first decode step only
  decode_step_later  decode_step of every later decode step
  free               free

A refused allocation (AdmissionRefused) is counted; the request is freed (untimed) and skipped.

Whole stream:
  wall_s             the replay's wall time: every call above plus the driver's own work (clock
                     reads, sample lists) and the lookup_hash pass; the manager's construction
                     is not in it (setup_s)
  stream_s           wall_s less the lookup_hash pass (measurement only, not serving): the time
                     the stream took to serve, what vllm_side's stream_s is
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import sys
import time

from hybridkv.bench.percentile import nearest_rank, summarize

CALL_TYPES = ("lookup", "lookup_hash", "lookup_excl_hash", "prefill_allocate", "prefill_commit",
              "prefill", "decode_step", "decode_step_first", "decode_step_later", "free")
VOCAB = 32_000          # vllm_side.VOCAB: decode tokens wrap at it
HYBRIDKV_DEFAULTS = {"layout": {"preset": "full", "block_size": 16}, "num_blocks": 4096,
                     "every_n": 0, "device": "cpu", "guards": "on", "checked": False,
                     "warmup": 0, "refusal_reps": 0}


# -- guards ---------------------------------------------------------------------------------
@contextlib.contextmanager
def stubbed_guards():
    """Every spec guard the runtime calls replaced by ``True``: the guards of the compiled
    transition tables (hybridkv.cache.tables rows), the funnel's predicates
    (hybridkv.cache.funnel can_hit_aligned / can_hit_abi, its READY_CHECKS: readable + covers),
    pool.can_hit_bytes, admission.can_admit_objects and manager.can_read_pinned.  Kept:
    state-based routing (an event still needs its source state), guards that *choose* between
    two rows of one (state, event) (unpin: keep pinned vs back to ready), the funnel's group
    intersection (can_hit_groups -> plain ``all``) and best_hit -- stubbing those would change
    decisions, not cost."""
    from hybridkv.cache import admission, funnel, manager, pool, tables
    from spec import state
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    for cls in state.MACHINES:
        t = tables.table_for(cls)
        patch(t, "rows", {k: (rows if len(rows) > 1 else [((), tgt) for _, tgt in rows])
                          for k, rows in t.rows.items()})
    yes = lambda *a, **k: True                                  # noqa: E731
    for name in ("can_hit_aligned", "can_hit_abi"):
        patch(funnel, name, yes)
    patch(funnel, "can_hit_groups", all)     # the intersection decides, it is not a check
    patch(funnel, "READY_CHECKS", {k: [] for k in funnel.READY_CHECKS})
    patch(pool, "can_hit_bytes", yes)
    patch(admission, "can_admit_objects", yes)
    patch(manager, "can_read_pinned", yes)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


# -- set-up -----------------------------------------------------------------------------------
def make_layout(spec):
    """A ModelLayout from {"preset": "v4-mini" | "full", **keyword arguments}."""
    from hybridkv.layout import ModelLayout
    kw = {k: v for k, v in spec.items() if k != "preset"}
    if spec["preset"] == "v4-mini":
        return ModelLayout.v4_mini(**kw)
    if spec["preset"] == "full":
        return ModelLayout.full(**kw)
    raise ValueError(f"layout preset must be 'v4-mini' or 'full': {spec['preset']!r}")


def pool_key(name):
    kind, _, group = name.partition("/")
    return kind, group


def build_manager(hk):
    from hybridkv.cache.manager import CacheManager
    layout = make_layout(hk["layout"])
    n = hk["num_blocks"]
    if isinstance(n, dict):
        n = {pool_key(k): v for k, v in n.items()}
    return CacheManager(layout, num_blocks=n, device=hk["device"], every_n=hk["every_n"],
                        checked=hk["checked"])


def load_stream(path):
    """(config, hybridkv section, requests) of STREAM.json; ValueError on a malformed one."""
    with open(path) as f:
        stream = json.load(f)
    config = {k: v for k, v in stream.items() if k not in ("requests", "hybridkv")}
    config.setdefault("mode", "serial")
    if config["mode"] not in ("serial", "decode"):
        raise ValueError(f"mode must be 'serial' or 'decode': {config['mode']!r}")
    hk = dict(HYBRIDKV_DEFAULTS)
    hk.update(stream.get("hybridkv") or {})
    if hk["guards"] not in ("on", "stubbed", "paired"):
        raise ValueError(f"guards must be 'on', 'stubbed' or 'paired': {hk['guards']!r}")
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
    if not 0 <= hk["warmup"] <= len(requests):
        raise ValueError(f"warmup must be in [0, {len(requests)}]: {hk['warmup']!r}")
    return config, hk, requests


# -- the driver -------------------------------------------------------------------------------
class Driver:
    """Plays the engine's part for one CacheManager; records per-call times (ns), hits and
    refusals.  Mirrors vllm_side.Driver."""

    def __init__(self, cache):
        from hybridkv.cache import CheckedTokens
        from hybridkv.cache.index import extend_chain, root_key
        from hybridkv.errors import AdmissionRefused
        self.cache, self._checked = cache, CheckedTokens
        self.refused_error = AdmissionRefused
        self._extend, self._root = extend_chain, root_key(cache.layout, b"")
        self.times_ns = {name: [] for name in CALL_TYPES}
        self.num_lookups = self.prompt_tokens = self.hit_tokens = 0
        self.hit_requests = 0
        self.refused_prefill = self.refused_decode = 0
        self.refused_ids = []
        self.decoded = {}           # request id -> decode steps taken

    def admit(self, spec):
        """Look up, allocate and commit one prompt.  Returns True, or False when the allocation
        was refused (the request is then freed)."""
        cache, clock, rid, prompt = self.cache, time.perf_counter_ns, spec["id"], spec["prompt"]
        t0 = clock()
        source = self._checked(cache.vocab, prompt)     # the prompt's arrival: ids checked
        ta = clock()
        plan = cache.lookup(rid, source.prefix(len(prompt)))
        t1 = clock()
        self._extend([], self._root, prompt, cache.layout.granule,    # hashing alone, as
                     source.words)            # the lookup hashes it (the arrival packed it)
        t2 = clock()
        self.times_ns["lookup"].append(t1 - t0)
        self.times_ns["lookup_hash"].append(t2 - t1)
        self.times_ns["lookup_excl_hash"].append(max(0, (t1 - ta) - (t2 - t1)))
        H = plan.reuse_tokens
        self.num_lookups += 1
        self.prompt_tokens += len(prompt)
        self.hit_tokens += H
        self.hit_requests += H > 0
        t0 = clock()
        try:
            a = cache.allocate(rid, len(prompt) - H)
        except self.refused_error:
            self.times_ns["prefill_allocate"].append(clock() - t0)
            self.refused_prefill += 1
            self.refused_ids.append(rid)
            cache.free(rid)
            return False
        t1 = clock()
        L = a.start
        for P in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
            cache.commit(rid, P - L)
            L = P
        t2 = clock()
        self.times_ns["prefill_allocate"].append(t1 - t0)
        self.times_ns["prefill_commit"].append(t2 - t1)
        self.times_ns["prefill"].append(t2 - t0)
        self.decoded[rid] = 0
        return True

    def decode(self, rid, token):
        """One decode step.  Returns False when the allocation was refused (the request is then
        freed)."""
        cache, clock = self.cache, time.perf_counter_ns
        t0 = clock()
        try:
            cache.allocate(rid, 1)
        except self.refused_error:
            self.refused_decode += 1
            self.refused_ids.append(rid)
            cache.free(rid)
            return False
        cache.commit(rid, 1, [token])
        dt = clock() - t0
        self.times_ns["decode_step"].append(dt)
        first = self.decoded[rid] == 0
        self.times_ns["decode_step_first" if first else "decode_step_later"].append(dt)
        self.decoded[rid] += 1
        return True

    def free(self, rid):
        t0 = time.perf_counter_ns()
        self.cache.free(rid)
        self.times_ns["free"].append(time.perf_counter_ns() - t0)


def decode_token(spec, step):
    return (spec["prompt"][-1] + step) % VOCAB


def run_serial(driver, specs):
    """Requests one after another: admit, decode_steps steps, free (vllm_side.run_serial)."""
    for spec in specs:
        if not driver.admit(spec):
            continue
        alive = True
        for step in range(spec["decode_steps"]):
            alive = driver.decode(spec["id"], decode_token(spec, step))
            if not alive:
                break
        if alive:
            driver.free(spec["id"])


def run_decode(driver, specs):
    """Admit every request, then rounds in which every live request takes one decode step, then
    free all (vllm_side.run_decode)."""
    live = [spec for spec in specs if driver.admit(spec)]
    rounds = max((spec["decode_steps"] for spec in live), default=0)
    for step in range(rounds):
        live = [spec for spec in live
                if step >= spec["decode_steps"] or driver.decode(spec["id"],
                                                                 decode_token(spec, step))]
    for spec in live:
        driver.free(spec["id"])


def replay(config, hk, requests):
    """Build a manager and drive the stream; returns (driver, cache, setup_s, wall_s)."""
    runner = run_serial if config["mode"] == "serial" else run_decode
    t0 = time.perf_counter()
    cache = build_manager(hk)
    setup_s = time.perf_counter() - t0
    driver = Driver(cache)
    gc.collect()
    gc.freeze()   # as vllm_side does (vLLM's EngineCore freezes the start-up heap)
    t0 = time.perf_counter()
    runner(driver, requests)
    return driver, cache, setup_s, time.perf_counter() - t0


class PairedDriver:
    """Guard overhead with the load noise paired out: two managers fed the same stream in
    lockstep, every call made on both back to back -- ``on`` with the spec guards,
    ``stubbed`` inside stubbed_guards() (entered and left outside the timed calls) -- the
    order flipped on every request.  The stubs keep every decision, so both caches stay
    identical (checked: each call's outcome must agree)."""

    def __init__(self, on, stubbed):
        self.on, self.stubbed, self.n = on, stubbed, 0

    def _both(self, method, *args):
        order = [(self.on, False), (self.stubbed, True)]
        out = []
        for driver, stub in (order if self.n % 2 == 0 else order[::-1]):
            with stubbed_guards() if stub else contextlib.nullcontext():
                out.append(getattr(driver, method)(*args))
        if out[0] != out[1]:
            raise AssertionError(f"guards on / stubbed disagree on {method}{args[:1]}: {out}")
        return out[0]

    def admit(self, spec):
        self.n += 1
        return self._both("admit", spec)

    def decode(self, rid, token):
        return self._both("decode", rid, token)

    def free(self, rid):
        return self._both("free", rid)


def replay_paired(config, hk, requests):
    """{"on": driver, "stubbed": driver, "wall_s"} of a PairedDriver replay."""
    runner = run_serial if config["mode"] == "serial" else run_decode
    on, stubbed = Driver(build_manager(hk)), Driver(build_manager(hk))
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    runner(PairedDriver(on, stubbed), requests)
    return {"on": on, "stubbed": stubbed, "wall_s": time.perf_counter() - t0}


def paired_result(config, hk, requests, paired):
    on, stub = paired["on"], paired["stubbed"]
    calls = ("lookup", "prefill_allocate", "prefill_commit", "prefill", "decode_step", "free")
    p50 = {m: {c: summarize(d.times_ns[c])["p50"] for c in CALL_TYPES}
           for m, d in (("on", on), ("stubbed", stub))}
    return {
        "config": dict(config, num_requests=len(requests)), "hybridkv": hk,
        "wall_s": round(paired["wall_s"], 4),
        "timed_s": {"on": _timed_ns(on) / 1e9, "stubbed": _timed_ns(stub) / 1e9},
        "overhead": _timed_ns(on) / _timed_ns(stub) - 1,
        "overhead_per_call_type": {
            c: sum(on.times_ns[c]) / sum(stub.times_ns[c]) - 1 for c in calls
            if sum(stub.times_ns[c])},
        "p50_us": p50,
        "hits": {"on": on.hit_tokens, "stubbed": stub.hit_tokens},
    }


def _timed_ns(driver):
    return sum(sum(driver.times_ns[k]) for k in ("lookup", "prefill", "decode_step", "free"))


def result(config, hk, requests, driver, cache, setup_s, wall_s):
    import torch

    import hybridkv
    stats = cache.stats()
    return {
        "hybridkv_version": getattr(hybridkv, "__version__", None),
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "config": dict(config, num_requests=len(requests),
                       total_decode_steps=sum(r["decode_steps"] for r in requests)),
        "hybridkv": dict(hk, granule=cache.layout.granule,
                         pool_blocks={f"{k}/{g}": p.n for (k, g), p in cache.pools.items()},
                         pool_bytes=sum(p.n * p.block_nbytes for p in cache.pools.values())),
        "setup_s": round(setup_s, 4),
        "wall_s": round(wall_s, 6),
        "stream_s": round(wall_s - sum(driver.times_ns["lookup_hash"]) / 1e9, 6),
        "timed_s": round(_timed_ns(driver) / 1e9, 4),
        "timings_us": {name: summarize(driver.times_ns[name]) for name in CALL_TYPES},
        "hits": {
            "lookups": driver.num_lookups,
            "prompt_tokens": driver.prompt_tokens,
            "hit_tokens": driver.hit_tokens,
            "hit_requests": driver.hit_requests,
            "hit_rate": round(driver.hit_tokens / driver.prompt_tokens, 6)
            if driver.prompt_tokens else 0.0,
            "outcomes": stats["hit"], "partial": stats["partial"], "miss": stats["miss"],
        },
        "refused": {"prefill": driver.refused_prefill, "decode": driver.refused_decode,
                    "request_ids": driver.refused_ids[:50]},
        "final": {"requests": stats["requests"], "kv_bytes_held": stats["kv_bytes_held"],
                  "checkpoints": stats["checkpoints"],
                  "snapshot_bytes_copied": stats["snapshot_bytes_copied"],
                  "free_blocks": {k: v["free"] for k, v in stats["pools"].items()}},
    }


def run(config, hk, requests):
    import torch
    torch.set_num_threads(1)     # pool copies are small; one thread keeps timings stable
    if hk["guards"] == "paired":
        paired = replay_paired(config, hk, requests)
        res = paired_result(config, hk, requests, paired)
        if hk["refusal_reps"]:          # on the guards-on cache the stream left behind
            res["refusal"] = [measure_refusal(paired["on"].cache, requests[0]["prompt"],
                                              hk["refusal_reps"], state)
                              for state in ("looked-up", "running")]
        return res
    guard = stubbed_guards() if hk["guards"] == "stubbed" else contextlib.nullcontext()
    with guard:
        if hk["warmup"]:
            runner = run_serial if config["mode"] == "serial" else run_decode
            warm = [dict(r, id=f"warmup-{r['id']}") for r in requests[:hk["warmup"]]]
            runner(Driver(build_manager(hk)), warm)
            del warm
        out = replay(config, hk, requests)
        res = result(config, hk, requests, *out)
        if hk["refusal_reps"]:          # on the cache the stream left behind
            res["refusal"] = [measure_refusal(out[1], requests[0]["prompt"], hk["refusal_reps"],
                                              state) for state in ("looked-up", "running")]
    return res


# -- bookkeeping bytes per block -----------------------------------------------------------------
def footprint(config, hk, requests):
    """The manager's bookkeeping bytes per block (hybridkv.bench.footprint says what is
    counted): its pools built on the meta device (no KV storage), the stream replayed under
    tracemalloc after a throwaway run of its first two requests.  Untimed."""
    from hybridkv.bench.footprint import HeapMeter, summary
    hk = dict(hk, device="meta")
    runner = run_serial if config["mode"] == "serial" else run_decode
    runner(Driver(build_manager(hk)), [dict(r, id=f"warmup-{r['id']}") for r in requests[:2]])
    with HeapMeter() as meter:
        cache = build_manager(hk)
        built = meter.held()
        runner(Driver(cache), requests)
        stream = meter.held()
    pools = cache.pools.values()
    return {"side": "hybridkv", "device": "meta",
            **summary(sum(p.n for p in pools), sum(p.n - p.n_free for p in pools), built,
                      stream)}


# -- the 10**9 refusal ---------------------------------------------------------------------------
def _state(cache, rid):
    s = cache.stats()
    req = cache.requests.get(rid)
    return ({k: v for k, v in s.items() if k in ("pools", "kv_bytes_held", "in_transit",
                                                  "checkpoints", "requests")},
            None if req is None else (req.phase, req.num_allocated_tokens,
                                      req.num_computed_tokens, len(req.reads)))


def measure_refusal(cache, prompt, reps, state):
    """Time ``allocate(rid, 10**9)`` (``reps`` times) on a looked-up request (``state`` =
    'looked-up') or one that allocated and committed its prompt ('running'); check it is
    refused and changes nothing (pools, index, the request)."""
    from hybridkv.errors import AdmissionRefused
    rid = f"refuse-{state}"
    cache.lookup(rid, prompt)
    if state == "running":
        a = cache.allocate(rid, len(prompt) - cache.requests[rid].plan.reuse_tokens)
        L = a.start
        for P in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
            cache.commit(rid, P - L)
            L = P
    before = _state(cache, rid)
    times, errors = [], set()
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        try:
            cache.allocate(rid, 10 ** 9)
            errors.add("not refused")
        except AdmissionRefused as e:
            errors.add(type(e).__name__)
        times.append(time.perf_counter_ns() - t0)
    unchanged = _state(cache, rid) == before
    cache.free(rid)
    times.sort()
    return {"state": state, "error": "/".join(sorted(errors)), "reps": reps,
            "p50_us": nearest_rank(times, 50) / 1000, "max_us": times[-1] / 1000,
            "unchanged": unchanged, "cache_kv_bytes_held": before[0]["kv_bytes_held"]}


def main(argv):
    args = argv[1:]
    measure = footprint if args[:1] == ["--footprint"] else run
    if len(args) != 1 + (measure is footprint):
        print("usage: python -m hybridkv.bench.hybridkv_side [--footprint] STREAM.json",
              file=sys.stderr)
        return 2
    out = os.fdopen(os.dup(1), "w")       # stdout carries exactly one JSON object
    sys.stdout.flush()
    os.dup2(2, 1)
    config, hk, requests = load_stream(args[-1])
    res = measure(config, hk, requests)
    out.write(json.dumps(res) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
