"""`hybridkv check-kernels`: every kernel against its torch reference, then the resume grid
(hybridkv.model.resume: warm == cold through the CacheManager, bitwise) and a greedy
generation cold vs resumed, per backend.  Exit status 1 on any mismatch.

`hybridkv check-kernels --compile sm_80,sm_90`: instead, every kernel compiled ahead of time
(kernels.aot, no GPU needed) for those GPUs at V4-mini's shapes and DeepSeek-V4's, in fp32,
bf16 and bf16 over fp8 (e4m3) pools (--dtypes); one row per kernel, target, shape and dtype;
exit status 1 if any does not compile or does not fit the device (fp8 on sm_80, which has no
fp8 conversions, is a named not-supported row, not a failure)."""
import json
import sys
import time

import torch

NAME = "check-kernels"
HELP = "compare the Triton kernels with their torch references and run the resume grid"

GRIDS = ("default", "subset", "full")


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--grid-backend", choices=("torch", "triton", "both"), default="both",
                        help="backend(s) the resume grid runs on (triton: interpreted on CPU)")
    parser.add_argument("--grid", choices=GRIDS, default="default",
                        help="default: the full 3..385 grid on torch, a subset on triton "
                             "(interpreted: slow); subset / full: that grid on every backend")
    parser.add_argument("--span", type=int, default=None,
                        help="tokens each resumed request computes (default 12; 6 on the "
                             "triton subset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", metavar="TARGETS", default=None,
                        help="compile every kernel for these GPUs (e.g. sm_80,sm_90) instead "
                             "of running the checks; no GPU needed")
    parser.add_argument("--shapes", default=",".join(SHAPES), metavar="NAMES",
                        help=f"shapes to compile at (--compile): {', '.join(SHAPES)}")
    parser.add_argument("--dtypes", default="fp32,bf16,fp8", metavar="NAMES",
                        help="dtypes to compile at (--compile): fp32, bf16 (activations and "
                             "pools), fp8 (bf16 activations over e4m3 pools)")


SHAPES = ("v4-mini", "deepseek-v4")


def v4_mini_shape():
    """The kernel shape V4Mini's launches have: its config, and the rows per block of the pools
    its CacheManager hands the kernels (a CSA layer has every pool kind)."""
    from hybridkv.model import V4Mini
    from hybridkv.model.resume import MAX_LEN, make_cache
    from kernels.shapes import KernelShape
    model = V4Mini(seed=0)
    c = model.cfg
    pools = make_cache(model, [c.window]).layer_pools(c.layers.index("csa"))
    return KernelShape("v4-mini", c.n_heads, c.head_dim, c.idx_heads, c.idx_dim, c.window,
                       c.csa_ratio, c.hca_ratio, c.top_k, swa_rows=pools["swa"]["kv"].shape[1],
                       comp_rows=pools["comp"]["kv"].shape[1], max_pos=MAX_LEN - 1)


def run_compile(args):
    """The --compile table (or its JSON: {"compiled": [rows], "ok": ...})."""
    from kernels.aot import AotUnavailable, compile_in_subprocess, parse_targets
    from kernels.aot import row_ok
    from kernels.shapes import DEEPSEEK_V4, DTYPES, with_dtypes
    known = {"v4-mini": v4_mini_shape, "deepseek-v4": lambda: DEEPSEEK_V4}
    try:
        targets = parse_targets(args.compile)
        names = [n.strip() for n in args.shapes.split(",")]
        dtypes = [n.strip() for n in args.dtypes.split(",")]
        if set(names) - set(known):
            raise ValueError(f"unknown shape in {args.shapes!r}; known: {', '.join(known)}")
        if set(dtypes) - set(DTYPES):
            raise ValueError(f"unknown dtype in {args.dtypes!r}; known: {', '.join(DTYPES)}")
        rows = compile_in_subprocess([with_dtypes(known[n](), dt) for n in names
                                      for dt in dtypes], targets)
    except (ValueError, AotUnavailable) as e:
        print(json.dumps({"compiled": [], "ok": False, "error": str(e)}) if args.json
              else f"check-kernels --compile: {e}", file=sys.stdout if args.json else sys.stderr)
        return 2
    ok = all(row_ok(r) for r in rows)
    if args.json:
        print(json.dumps({"compiled": rows, "ok": ok}))
        return 0 if ok else 1
    print(f"{'kernel':<17}{'target':<7}{'shape':<12}{'dtype/kv':<24}{'ok':<4}{'regs':>5}"
          f"{'shared':>8}{'spills':>8}{'secs':>7}")
    for r in rows:
        head = (f"{r['kernel']:<17}{r['target']:<7}{r['shape']:<12}"
                f"{r['dtype'] + '/' + r['kv_dtype']:<24}")
        if "registers" in r:
            mark = "yes" if r["ok"] else "NO"
            print(f"{head}{mark:<4}{r['registers']:>5}{r['shared_bytes']:>8}"
                  f"{r['spill_bytes']:>8}{r['seconds']:>7}")
        elif r.get("unsupported"):
            print(f"{head}n/a  not supported: {r['unsupported']}")
        if not row_ok(r):
            print(f"  {r['kernel']} {r['shape']} {r['target']} {r['kv_dtype']}: {r['error']}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def _lengths(cfg, grid, backend):
    from hybridkv.model.resume import SUBSET, TRITON_SUBSET, grid_lengths
    if grid == "full" or (grid == "default" and backend == "torch"):
        return grid_lengths(cfg), "full"
    return list(TRITON_SUBSET if backend == "triton" else SUBSET), "subset"


def run_grid(backend, grid="default", seed=0, span=None):
    """The resume grid and the greedy check on one backend, as a JSON-ready dict."""
    from hybridkv.model import V4Mini
    from hybridkv.model.resume import check_grid, greedy_resume
    model = V4Mini(seed=seed, backend=backend)
    lengths, which = _lengths(model.cfg, grid, backend)
    if span is None:
        span = 6 if (backend == "triton" and which == "subset") else 12
    res = check_grid(model, lengths, span=span)
    t0 = time.perf_counter()
    H, prompt, new = (17, 26, 6) if backend == "torch" else (9, 14, 3)
    g = greedy_resume(model, H, prompt, new_tokens=new)
    return {"grid": which, "lengths": res.lengths, "aligned": res.aligned,
            "resumed_at": res.resumed_at,
            "span": res.span, "mismatches": res.mismatches,
            "bad": [c._asdict() for c in res.bad], "seconds": res.seconds,
            "greedy": {"H": g.H, "aligned": g.aligned, "cold_tokens": g.cold_tokens,
                       "resumed_tokens": g.resumed_tokens, "logits_equal": g.logits_equal,
                       "cold_ref_equal": g.cold_ref_equal,
                       "cold_ref_max_abs_diff": g.cold_ref_max_abs_diff, "ok": g.ok,
                       "seconds": round(time.perf_counter() - t0, 3)}}


def run(args):
    if args.compile:
        return run_compile(args)
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
        grid, mismatches = {}, 0
        for be in backends:
            print(f"resume grid on {be} ...", file=sys.stderr)
            grid[be] = run_grid(be, args.grid, args.seed, args.span)
            mismatches += grid[be]["mismatches"] + (0 if grid[be]["greedy"]["ok"] else 1)
    finally:
        torch.set_num_threads(threads)
    ok = mismatches == 0 and all(k["max_abs_err"] <= k["tol"] for k in kernels)
    out = {"kernels": kernels,
           "resume_grid": {"mismatches": mismatches, "backends": grid,
                           "grid_seconds": {be: g["seconds"] for be, g in grid.items()}},
           "ok": ok}
    if args.json:
        print(json.dumps(out))
    else:
        for k in kernels:
            print(f"{k['name']:<20} max_abs_err={k['max_abs_err']:.3g} tol={k['tol']:g}")
        for be, g in grid.items():
            pts = sorted(set(g["aligned"]))
            print(f"resume grid {be} ({g['grid']}, {len(g['lengths'])} lengths "
                  f"{g['lengths'][0]}..{g['lengths'][-1]}, {len(pts)} resume points H'): "
                  f"{g['mismatches']} mismatches in {g['seconds']} s; greedy "
                  f"{'ok' if g['greedy']['ok'] else 'FAILED'}")
            for c in g["bad"]:
                print(f"  H={c['H']} H'={c['aligned']} resumed at {c['reuse']} "
                      f"max|warm-cold|={c['max_abs_diff']:.3g}")
        print("OK" if ok else "FAILED")
    return 0 if ok else 1
