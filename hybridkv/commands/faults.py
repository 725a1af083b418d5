"""`hybridkv faults`: run the disk tier's fault matrix and its bandwidth benchmark."""
import json
import sys
import tempfile

NAME = "faults"
HELP = ("Inject disk/Redis faults (EIO, ENOSPC, bit flips, truncation, crash before rename, "
        "recycled destination, racing processes, lost Redis) and report wrong outputs and "
        "crashes per fault, plus load vs sequential-read bandwidth.")


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", default=None,
                        help="directory on the file system to test (default: system temp)")
    parser.add_argument("--bench-objects", type=int, default=8)
    parser.add_argument("--bench-object-mib", type=int, default=4)


def run(args):
    from hybridkv.disk.bench import benchmark
    from hybridkv.disk.faults_proc import run_all

    rows = run_all(args.dir)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        b = benchmark(d, args.bench_objects, args.bench_object_mib << 20)
    out = {"faults": [r.as_json() for r in rows], "load_bandwidth_ratio": b.load_bandwidth_ratio}
    bad = any(r.wrong_outputs or r.crashes or not r.expected for r in rows)
    if args.json:
        print(json.dumps(out))
    else:
        w = max(len(r.name) for r in rows)
        print(f"{'fault':<{w}}  wrong  crashes  outcome")
        for r in rows:
            j = r.as_json()
            print(f"{r.name:<{w}}  {r.wrong_outputs:>5}  {r.crashes:>7}  {j['outcome']}")
    print(f"\nspill {b.spill_bytes_per_s / 1e6:.0f} MB/s, load {b.load_bytes_per_s / 1e6:.0f}"
          f" MB/s, sequential read {b.seq_read_bytes_per_s / 1e6:.0f} MB/s, ratio "
          f"{b.load_bandwidth_ratio:.2f} ({b.n_objects} x {b.object_bytes >> 20} MiB; page "
          f"cache {'dropped via fadvise' if b.cache_dropped else 'NOT dropped'})",
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0
