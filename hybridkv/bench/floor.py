"""`hybridkv bench floor`: what the spec's own guards and effects cost in this interpreter,
beside what the runtime costs for the same blocks, measured in one run.

Every block change the runtime makes runs the spec's guard and effect functions (the same ones
the prover checks) on the block's record.  This prints the cost of those calls alone -- one
block's lifecycle (write, publish, fill, seal, pin, unpin, evict) event by event, and as runs of
blocks (the columns ``Pool.fire_run`` passes; per block, and per event over the whole run) --
and the CacheManager's cost per block for the same lifecycle: a decode step's block (allocate
and commit 16 tokens, an eviction making its room) and a prefill's blocks (lookup, allocate,
commit, then free, the cache full).  The ratio runtime / spec is the bookkeeping around the
spec: pools, index, policy, liveness.  The lower bound it gives: no runtime that runs the spec
on every block event is cheaper than these calls (a free runs at least ``unpin`` over its
blocks: one event over the run).
"""
import random
import statistics
import time

import numpy as np

from hybridkv.bench.breakeven import EVENTS
from hybridkv.cache import CacheManager
from hybridkv.cache.records import RecordColumns
from hybridkv.cache.tables import GroupCtx, table_for
from hybridkv.layout import ModelLayout
from spec.common import FREE
from spec.effects import EFFECTS
from spec.state import MACHINES, RECS

BLOCK_TOKENS = 16
LIFECYCLE = EVENTS             # a chain block's life, as bench.breakeven times it
RUN_LENGTHS = (16, 140, 890)   # a short run; about a request of bench vs-vllm's decode and
#                               Mooncake streams (their mean blocks a request)


def _best_us(fn, number, repeat=5):
    """The best of ``repeat`` passes of ``number`` calls, in microseconds a call."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        best = min(best, time.perf_counter_ns() - t0)
    return best / number / 1e3


def spec_single(number=5000):
    """One compressed-KV block's lifecycle through the table and the effects, event by event
    (``Pool.fire`` without its bookkeeping): microseconds per lifecycle."""
    table, rec_type = table_for(MACHINES[0]), RECS[0]
    cx = GroupCtx(ModelLayout.full(block_size=BLOCK_TOKENS).groups[0])
    args = {"write": (BLOCK_TOKENS,)}
    make = tuple.__new__

    def lifecycle():
        rec = rec_type()
        for event in LIFECYCLE:
            tgt = table.fire(rec.st, event, rec, cx)
            new = EFFECTS[event](rec, cx, *args.get(event, ()))
            rec = make(rec_type, (tgt, *new[1:])) if tgt != new.st else new
        return rec
    end = lifecycle()
    if (end.st, end.ver) != (FREE, 1):             # every event ran: evicted, a new version
        raise AssertionError("the lifecycle does not end FREE at version 1", end)
    return _best_us(lifecycle, number)


def spec_run(n, number=300):
    """The same lifecycle for a run of n blocks as columns (``Pool.fire_run`` without its
    bookkeeping: gather, each event's guards and effect once over the run, scatter):
    microseconds per block."""
    table, rec_type = table_for(MACHINES[0]), RECS[0]
    cx = GroupCtx(ModelLayout.full(block_size=BLOCK_TOKENS).groups[0])
    recs, blocks = RecordColumns(rec_type, n), list(range(n))
    args = {"write": (np.arange(1, n + 1, dtype=np.int64) * BLOCK_TOKENS,)}

    def lifecycle():
        idx, o = recs.gather(blocks)
        for event in LIFECYCLE:
            tgts = table.target_many(o.st, event, o, cx)
            new = EFFECTS[event](o, cx, *args.get(event, ()))._replace(st=tgts)
            recs.scatter(idx, new, o)
            o = new
    lifecycle()
    ends = recs.values(blocks, "st"), recs.values(blocks, "ver")
    if ends != ([FREE] * n, [1] * n):
        raise AssertionError("the run's lifecycle does not end FREE at version 1", ends)
    return _best_us(lifecycle, number) / n


def _serve(m, rid, tokens):
    """One prompt through ``m``: lookup, allocate the rest, commit it, free."""
    plan = m.lookup(rid, tokens)
    a = m.allocate(rid, len(tokens) - plan.reuse_tokens)
    m.commit(rid, a.end - a.start)
    m.free(rid)


def _filled_manager(num_blocks, rng):
    """A full-attention manager whose pool is full of cached blocks (``num_blocks // 64 + 8``
    distinct prompts of 64 blocks through it, more than it holds): every new block evicts
    one."""
    m = CacheManager(ModelLayout.full(block_size=BLOCK_TOKENS), device="meta",
                     num_blocks=num_blocks)
    for i in range(num_blocks // 64 + 8):
        _serve(m, f"fill{i}", [rng.randrange(1000) for _ in range(1024)])
    return m


def runtime_decode(num_blocks=4096, blocks=1500, seed=1):
    """A decode step's block through the CacheManager: allocate and commit 16 tokens (the
    commit seals and publishes it; the allocation evicts a cached block): p50 microseconds
    per block."""
    rng = random.Random(seed)
    m = _filled_manager(num_blocks, rng)
    m.lookup("d", [rng.randrange(1000) for _ in range(96)])
    m.allocate("d", 96)
    m.commit("d", 96)
    clock, per_block = time.perf_counter_ns, []
    for _ in range(blocks):
        tokens = [rng.randrange(1000) for _ in range(BLOCK_TOKENS)]
        t0 = clock()
        m.allocate("d", BLOCK_TOKENS)
        m.commit("d", BLOCK_TOKENS, tokens)
        per_block.append(clock() - t0)
    return statistics.median(per_block) / 1e3


def runtime_prefill(n, num_blocks=4096, requests=200, seed=2):
    """A prefill's run of n blocks through the CacheManager (lookup of a new prompt, allocate,
    commit, free; the cache full): p50 microseconds per block."""
    rng = random.Random(seed)
    m = _filled_manager(num_blocks, rng)
    clock, per_block = time.perf_counter_ns, []
    for i in range(requests):
        tokens = [rng.randrange(1000) for _ in range(n * BLOCK_TOKENS)]
        t0 = clock()
        _serve(m, i, tokens)
        per_block.append((clock() - t0) / n)
    return statistics.median(per_block) / 1e3


def run_all():
    single = spec_single()
    out = {"lifecycle": list(LIFECYCLE), "block_tokens": BLOCK_TOKENS,
           "decode_block": {"spec_us": round(single, 3),
                            "spec_us_per_event": round(single / len(LIFECYCLE), 3),
                            "runtime_us": round(runtime_decode(), 3)},
           "prefill_runs": {}}
    out["decode_block"]["ratio"] = round(out["decode_block"]["runtime_us"] / single, 2)
    for n in RUN_LENGTHS:
        spec_us, runtime_us = spec_run(n), runtime_prefill(n)
        out["prefill_runs"][n] = {"spec_us_per_block": round(spec_us, 3),
                                  "spec_us_per_event_run": round(spec_us * n / len(LIFECYCLE),
                                                                 1),
                                  "runtime_us_per_block": round(runtime_us, 3),
                                  "ratio": round(runtime_us / spec_us, 2)}
    return out


def table(out):
    d = out["decode_block"]
    lines = [f"spec guards + effects of one block's lifecycle ({', '.join(out['lifecycle'])}) "
             f"vs the CacheManager's blocks ({out['block_tokens']}-token blocks, full "
             "attention, pool full)",
             f"  decode step's block, event by event: spec {d['spec_us']} us "
             f"({d['spec_us_per_event']} us an event), runtime {d['runtime_us']} us "
             f"(allocate + commit, its room evicted): {d['ratio']}x"]
    for n, r in out["prefill_runs"].items():
        lines.append(f"  prefill of {n} blocks, as runs: spec {r['spec_us_per_block']} us a "
                     f"block ({r['spec_us_per_event_run']} us an event over the run), runtime "
                     f"{r['runtime_us_per_block']} us a block (lookup, allocate, commit, free):"
                     f" {r['ratio']}x")
    return "\n".join(lines)
