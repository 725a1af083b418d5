"""Where a run of table transitions pays: ``Pool.fire_run`` as one run (numpy columns) vs block
by block, per event and run length, on this machine (what ``hybridkv.cache.pool.RUN_MIN`` is
set from).  Prints the median microseconds of each and their ratio, measured in one process:

    python -m hybridkv.bench.breakeven [--kind comp] [--reps 300]

A chain block's life is timed event by event (write, publish, fill, seal, pin, unpin, evict)
on a pool of the v4-mini layout's group (bookkeeping only: the meta device).
"""
import argparse
import time

from hybridkv.cache.pool import Pool
from hybridkv.cache.tables import GroupCtx
from hybridkv.layout import ModelLayout

EVENTS = ("write", "publish", "fill", "seal", "pin", "unpin", "evict")
LENGTHS = (2, 4, 6, 8, 12, 16, 24)
NO_LIMIT = 1 << 62


def life_times(pool, n, reps):
    """event -> the median microseconds of firing it on n blocks (their life in order)."""
    times = {event: [] for event in EVENTS}
    for _ in range(reps):
        blocks = pool.alloc_run(n)
        for event in EVENTS:
            args = ([pool.ctx.blocks[0]] * n, 0) if event == "write" else ()
            t0 = time.perf_counter_ns()
            pool.fire_run(blocks, event, *args)
            times[event].append(time.perf_counter_ns() - t0)
    return {e: sorted(ts)[len(ts) // 2] / 1e3 for e, ts in times.items()}


def bench_pool(kind, num_blocks):
    """A ``num_blocks``-block pool of ``kind`` for the v4-mini layout's first group holding
    that kind (meta device, no version or epoch limit)."""
    layout = ModelLayout.v4_mini()
    g = next(g for g in layout.groups if kind in g.kinds)
    return Pool(kind, g, num_blocks, layout.pool_tensors(kind, g), layout.abi(kind, g),
                GroupCtx(g, NO_LIMIT, NO_LIMIT), "meta")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="comp", choices=("comp", "idx"))
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args(argv)
    pool = bench_pool(args.kind, 4 * max(LENGTHS))
    print(f"{args.kind} pool of group {pool.group}: median us, one run / block by block (ratio)")
    print("blocks " + " ".join(f"{e:>20s}" for e in EVENTS))
    for n in LENGTHS:
        pool.run_min = 1
        run = life_times(pool, n, args.reps)
        pool.run_min = 1 << 30
        one = life_times(pool, n, args.reps)
        print(f"{n:6d} " + " ".join(f"{run[e]:6.1f} /{one[e]:6.1f} ({run[e] / one[e]:4.2f})"
                                    for e in EVENTS))


if __name__ == "__main__":
    main()
