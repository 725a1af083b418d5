"""`hybridkv check-kernels`: every kernel against its torch reference, then the resume grid."""
import json
import sys
import time

import torch

NAME = "check-kernels"
HELP = "compare the Triton kernels with their torch references and run the resume grid"


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--grid-backend", choices=("torch", "triton", "both"), default="both",
                        help="backend(s) the resume grid runs on (triton: interpreted on CPU)")
    parser.add_argument("--seed", type=int, default=0)


def run(args):
    from hybridkv.model import V4Mini
    from hybridkv.model.resume import check_grid, grid_lengths, greedy_resume
    from kernels.selfcheck import default_cases

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny ops: more threads only contend on a shared 2-core box
    try:
        worst = {}
        for check, case in default_cases(args.seed):
            e = check(case)
            if e.name not in worst or not e.max_abs_err <= worst[e.name].max_abs_err:
                worst[e.name] = e
        kernels = [{"name": e.name, "max_abs_err": e.max_abs_err, "tol": e.tol}
                   for e in worst.values()]
        backends = ["torch", "triton"] if args.grid_backend == "both" else [args.grid_backend]
        grid, lengths, mismatches, timings = {}, None, 0, {}
        for be in backends:
            print(f"resume grid on {be} ...", file=sys.stderr)
            model = V4Mini(seed=args.seed, backend=be)
            lengths = grid_lengths(model.cfg)
            t0 = time.perf_counter()
            res = check_grid(model, lengths)
            timings[be] = round(time.perf_counter() - t0, 3)
            g = greedy_resume(model, 17, 26)
            greedy_ok = g.cold_tokens == g.resumed_tokens and g.logits_equal
            grid[be] = {"mismatches": res.mismatches, "bad": res.bad, "greedy_ok": greedy_ok}
            mismatches += res.mismatches + (0 if greedy_ok else 1)
    finally:
        torch.set_num_threads(threads)
    ok = mismatches == 0 and all(k["max_abs_err"] <= k["tol"] for k in kernels)
    out = {"kernels": kernels,
           "resume_grid": {"lengths": lengths, "mismatches": mismatches, "backends": grid,
                           "grid_seconds": timings},
           "ok": ok}
    if args.json:
        print(json.dumps(out))
    else:
        for k in kernels:
            print(f"{k['name']:<18} max_abs_err={k['max_abs_err']:.3g} tol={k['tol']:g}")
        print(f"resume grid {lengths}: {mismatches} mismatches; seconds {timings}")
        print("OK" if ok else "FAILED")
    return 0 if ok else 1
