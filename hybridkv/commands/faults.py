"""`hybridkv faults`: run the disk tier's fault matrix and its bandwidth benchmark."""
import json
import sys
import tempfile

NAME = "faults"
HELP = ("Inject disk/Redis faults (EIO, ENOSPC, bit flips, truncation, crash before rename, "
        "recycled destination, racing processes, lost Redis, transient read errors, FIFO / "
        "symlink / device files, hung backend, full Redis, format-version skew; with the cache "
        "manager: version bump with loads in flight, forged plans, hung Redis) and report "
        "per fault: trials, wrong outputs, crashes, unnamed exceptions, hangs, intact entries "
        "lost, plus load vs sequential-read bandwidth.")


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", default=None,
                        help="directory on the file system to test (default: system temp)")
    parser.add_argument("--bench-objects", type=int, default=8)
    parser.add_argument("--bench-object-mib", type=int, default=4)


def run(args):
    from hybridkv.disk.bench import benchmark
    from hybridkv.testing.faults import manager          # harness: imported only to run it
    from hybridkv.testing.faults.proc import run_all

    rows = run_all(args.dir)
    for fn in manager.ROWS:                 # the cache manager on top of the tier
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            rows.append(fn(d))
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        b = benchmark(d, args.bench_objects, args.bench_object_mib << 20)
    out = {"faults": [r.as_json() for r in rows], "load_bandwidth_ratio": b.load_bandwidth_ratio}
    bad = any(r.bad for r in rows)
    if args.json:
        print(json.dumps(out))
    else:
        w = max(len(r.name) for r in rows)
        print(f"{'fault':<{w}}  trials  wrong  crashes  unnamed  hangs  lost  max ms  outcome")
        for r in rows:
            j = r.as_json()
            ms = "-" if r.max_latency_ms is None else f"{r.max_latency_ms:.2f}"
            print(f"{r.name:<{w}}  {r.trials:>6}  {r.wrong_outputs:>5}  {r.crashes:>7}  "
                  f"{r.unnamed_exceptions:>7}  {r.hangs:>5}  {r.intact_lost:>4}  {ms:>6}  "
                  f"{j['outcome']}")
    print(f"\nspill {b.spill_bytes_per_s / 1e6:.0f} MB/s, load {b.load_bytes_per_s / 1e6:.0f}"
          f" MB/s, sequential read {b.seq_read_bytes_per_s / 1e6:.0f} MB/s, ratio "
          f"{b.load_bandwidth_ratio:.2f} ({b.n_objects} x {b.object_bytes >> 20} MiB; page "
          f"cache {'dropped via fadvise' if b.cache_dropped else 'NOT dropped'})",
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0
