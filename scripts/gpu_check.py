"""One-shot GPU check of the kernels and the model over one memory, on a CUDA machine, in under
5 minutes (the quick resume grid; --full-grid for all of it).  One JSON object; exit 0 when
every comparison passes, 1 when one fails, 2 without CUDA (the object says why).

  python scripts/gpu_check.py [--json] [--full-grid]
  python scripts/gpu_check.py --cpu        # the CPU-safe parts only (smoke test, no GPU)

1. kernels: each kernel JIT-compiled vs its torch reference (max abs error) at V4-mini's and
   DeepSeek-V4's shapes (kernels.selfcheck.shape_cases), the fixed selfcheck cases, the
   16-head tl.dot path;
2. model: V4Mini's KV in a CacheManager on the GPU: Triton vs torch cold logits, the resume
   grid (warm == cold bitwise at the aligned H') and the greedy check, on Triton;
3. bandwidth: decode attention at DeepSeek-V4's shape, B requests, CUDA events; the unique KV
   bytes each launch must read per second, and that as a percentage of the GPU's peak;
4. graph: (a) indexer + sparse + HCA attention at DeepSeek-V4's shape captured as a CUDA graph
   behind kernels.GuardedGraph, replayed vs eager, a relocated pool refused, re-captured;
   (b) hybridkv.engine.graph.DecodeGraph over the CacheManager's pool tensors: the Engine
   replays the captured window gather every decode step (each replay vs an eager gather),
   its tokens equal the cold run's argmax, a relocation is refused and re-captured, and the
   replayed gather equals the pool rows of the request's window pages.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):          # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_BY_NAME = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}
QUICK_LENGTHS = [3, 4, 5, 9, 10, 11, 16, 17, 33, 95, 96, 97]


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_to(v, dev) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, dev) for v in x)
    return x


def kernel_shapes():
    """The shapes the kernels are checked at: V4-mini's (its config and pools), DeepSeek-V4's."""
    from hybridkv.commands.check_kernels import v4_mini_shape
    from kernels.shapes import DEEPSEEK_V4
    return [v4_mini_shape(), DEEPSEEK_V4]


def check_kernels(dev, dot_path=True, shapes=None):
    """Max abs error of every kernel case against its reference, run on ``dev``."""
    from kernels.selfcheck import attention_case, check_attention, default_cases, shape_cases
    cases = [("selfcheck", c) for c in default_cases(0)]
    if dot_path:
        cases += [("dot-path", (check_attention, attention_case(
            1, m, 16, 16, 16, 4, 20, [(40, 3), (700, 2)], r, top_k=80)))
            for m, r in (("swa", 4), ("sparse", 4), ("hca", 8))]
    for shape in kernel_shapes() if shapes is None else shapes:
        cases += [(shape.name, c) for c in shape_cases(shape)]
    out = []
    for shape_name, (check, case) in cases:
        e = check(_to(case, dev))
        out.append({"name": e.name, "shape": shape_name, "max_abs_err": e.max_abs_err,
                    "tol": e.tol})
    return out


def check_model(dev, quick, lengths=None, span=12, greedy=(17, 26, 6)):
    """Triton vs torch cold logits on ``dev``, then the resume grid and greedy on Triton."""
    from hybridkv.model import V4Mini
    from hybridkv.model.resume import check_grid, cold_reference, greedy_resume, grid_lengths
    from hybridkv.model.resume import prompt_tokens
    tri, ref = V4Mini(0, "triton", dev), V4Mini(0, "torch", dev)
    toks = prompt_tokens(tri.cfg, 40)
    a, b = cold_reference(tri, toks, 7), cold_reference(ref, toks, 7)
    if lengths is None:
        lengths = QUICK_LENGTHS if quick else grid_lengths(tri.cfg)
    g = check_grid(tri, lengths, span=span)
    t0 = time.perf_counter()
    gr = greedy_resume(tri, *greedy[:2], new_tokens=greedy[2])
    return {"backend_max_abs_diff": float((a - b).abs().max()), "grid_lengths": g.lengths,
            "grid_aligned": g.aligned, "grid_resumed_at": g.resumed_at, "grid_span": g.span,
            "grid_mismatches": g.mismatches, "grid_bad": [c._asdict() for c in g.bad],
            "grid_seconds": g.seconds, "greedy_ok": gr.ok,
            "greedy_logits_equal": gr.logits_equal, "greedy_tokens_equal":
                gr.cold_tokens == gr.resumed_tokens,
            "greedy_cold_ref_max_abs_diff": gr.cold_ref_max_abs_diff,
            "greedy_cold_ref_tol": gr.cold_ref_tol,
            "greedy_seconds": round(time.perf_counter() - t0, 2)}


def _time(fn, iters=50):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def _decode_run(dev, mode, ratio, B, L, shape, dtype=torch.float32):
    """One decode attention launch at ``shape`` timed, pools and queries in ``dtype``: (unique
    bytes read and written, FLOPs of q.k and p.v over every head, seconds); its inputs are
    freed on return."""
    from kernels import hca_attention, sparse_attention, swa_attention
    from kernels.shapes import decode_inputs
    W, k = shape.window, shape.top_k
    q, swa, comp, plan, sink, n_ent = decode_inputs(shape, B, L, ratio, dev)
    q, swa, comp = (t.to(dtype) for t in (q, swa, comp))
    rows = W + {"swa": 0, "sparse": k, "hca": n_ent}[mode]
    size = q.element_size()
    nbytes = B * rows * shape.head_dim * size + 2 * q.numel() * size
    flops = 4 * B * shape.n_heads * rows * shape.head_dim
    fn = {"swa": lambda: swa_attention(q, swa, plan, sink, W),
          "sparse": lambda: sparse_attention(q, swa, comp, plan, sink, W),
          "hca": lambda: hca_attention(q, swa, comp, plan, sink, W, ratio)}[mode]
    return nbytes, flops, _time(fn)


def bandwidth(dev, B=256, L=32768):
    """Decode attention at DeepSeek-V4's shape (kernels.shapes.DEEPSEEK_V4), B requests at
    position L-1, fp32 and bf16 pools: unique KV bytes read per launch / time, that over the
    device's peak, and the launch's FLOP rate (every head reads the shared row: 64 heads make
    the launch about 64 FLOPs per byte at fp32, 128 at bf16)."""
    from kernels.shapes import DEEPSEEK_V4 as V4
    props = torch.cuda.get_device_properties(0)
    peak = next((v for n, v in PEAK_BY_NAME.items() if n in props.name), None)
    res = {"shape": V4.name, "B": B, "L": L, "W": V4.window, "heads": V4.n_heads,
           "head_dim": V4.head_dim, "top_k": V4.top_k, "device": props.name,
           "peak_bytes_per_s": peak, "runs": []}
    for dtype in (torch.float32, torch.bfloat16):
        for mode, ratio in (("swa", V4.csa_ratio), ("sparse", V4.csa_ratio),
                            ("hca", V4.hca_ratio)):
            run = {"mode": mode, "dtype": str(dtype).replace("torch.", "")}
            try:
                nbytes, flops, sec = _decode_run(dev, mode, ratio, B, L, V4, dtype)
                run.update(seconds=sec, bytes=nbytes, GB_per_s=round(nbytes / sec / 1e9, 1),
                           pct_of_peak=round(100 * nbytes / sec / peak, 1) if peak else None,
                           TFLOP_per_s=round(flops / sec / 1e12, 2))
            except Exception as e:   # report and go on: one failure must not hide the rest
                run["error"] = f"{type(e).__name__}: {e}"[:500]
            res["runs"].append(run)
            torch.cuda.empty_cache()
    return res


def kernel_graph_check(dev):
    """A decode step of the kernels captured as a CUDA graph behind GuardedGraph."""
    from kernels import GuardedGraph, LaunchRefused, hca_attention, index_topk, sparse_attention
    from kernels.shapes import DEEPSEEK_V4 as V4, decode_inputs
    B, L, W, m = 64, 4096, V4.window, V4.csa_ratio
    q, swa, comp, plan, sink, n_ent = decode_inputs(V4, B, L, m, dev)
    keys = torch.randn(comp.shape[0], comp.shape[1], V4.idx_dim, device=dev)
    iq = torch.randn(B, V4.idx_heads, V4.idx_dim, device=dev)
    iw = torch.randn(B, V4.idx_heads, device=dev)
    outs = {}

    def step(pool):
        index_topk(iq, iw, keys, plan, m)
        outs["sparse"] = sparse_attention(q, swa, pool, plan, sink, W)
        outs["hca"] = hca_attention(q, swa, pool, plan, sink, W, m)

    def capture(pool):
        step(pool)                        # compile + warm up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(pool)
        return GuardedGraph(graph.replay, {"q": q, "swa": swa, "comp": pool, "keys": keys,
                                           "sel": plan.sel})

    gg = capture(comp)
    q.copy_(torch.randn_like(q))          # refresh the static input, then replay
    gg.replay({"q": q, "swa": swa, "comp": comp, "keys": keys, "sel": plan.sel})
    torch.cuda.synchronize()
    got = {n: t.clone() for n, t in outs.items()}
    step(comp)
    err = max(float((got[n] - outs[n]).abs().max()) for n in got)
    moved = comp.clone()
    refused = False
    try:
        gg.replay({"q": q, "swa": swa, "comp": moved, "keys": keys, "sel": plan.sel})
    except LaunchRefused:
        refused = True
    gg2 = capture(moved)
    gg2.replay({"q": q, "swa": swa, "comp": moved, "keys": keys, "sel": plan.sel})
    torch.cuda.synchronize()
    err2 = max(float((outs[n] - got[n]).abs().max()) for n in got)
    return {"replay_vs_eager_max_abs_err": err, "relocated_replay_refused": refused,
            "recaptured_replay_max_abs_err": err2}


def decode_graph_check(dev, backend="triton", new_tokens=8, prompt_len=21):
    """DecodeGraph over the CacheManager's pool tensors (see module docstring, 4b)."""
    from hybridkv.engine import Engine
    from hybridkv.model import V4Mini
    from hybridkv.model.resume import cold_reference, make_cache, prompt_tokens
    model = V4Mini(0, backend, dev)
    total = prompt_len + 2 * new_tokens
    cache = make_cache(model, [total, total])
    eng = Engine(model, cache, chunk=8, graph=True)
    prompt = prompt_tokens(model.cfg, prompt_len, seed=5)
    (gen,) = eng.generate([prompt], new_tokens)
    first = eng.stats()
    eng.graph.relocate()                       # every captured buffer address moves
    (gen2,) = eng.generate([prompt + gen], new_tokens)
    st = eng.stats()
    seq = prompt + gen + gen2
    cold = cold_reference(model, seq[:-1])
    want = [int(cold[i].argmax()) for i in range(prompt_len - 1, len(seq) - 1)]
    # the replayed gather is the pool rows of the request's window pages
    from hybridkv.model import SeqWork
    from hybridkv.model.resume import _pins
    H = cache.lookup("probe", seq).reuse_tokens
    cache.allocate("probe", 1)
    w = SeqWork(seq[H:H + 1], H, cache.tables("probe"), _pins(cache, "probe"), 1)
    window = eng.graph.step(w)
    pages = [b for b in w.tables[eng.graph.group].swa if b >= 0]
    gather_ok = torch.equal(window.nan_to_num(7.0), eng.graph.pool[pages].nan_to_num(7.0))
    cache.free("probe")
    return {"cuda": eng.graph.cuda, "tokens_equal_cold": gen + gen2 == want,
            "captures": st["graph_captures"], "replays": st["graph_replays"],
            "replays_before_relocation": first["graph_replays"],
            "refused_after_relocation": st["graph_refused"] - first["graph_refused"],
            "replay_mismatches": eng.graph.mismatches, "gather_equals_pool_rows": gather_ok}


def _decode_graph_ok(g):
    return (g.get("tokens_equal_cold") is True and g.get("replay_mismatches") == 0
            and g.get("refused_after_relocation", 0) >= 1 and g.get("captures", 0) >= 2
            and g.get("replays_before_relocation", 0) >= 1 and g.get("gather_equals_pool_rows"))


def _run_parts(parts):
    out = {}
    for name, fn in parts:
        t = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"[:1000]}
        print(f"{name}: {time.perf_counter() - t:.1f}s", file=sys.stderr)
    return out


def cpu_smoke():
    """The CPU-safe parts (interpreted Triton, eager decode graph): the script's code paths."""
    dev = torch.device("cpu")
    torch.set_num_threads(1)
    out = _run_parts((
        ("kernels", lambda: check_kernels(dev, dot_path=False, shapes=kernel_shapes()[:1])),
        ("model", lambda: check_model(dev, True, lengths=[5, 10], span=4, greedy=(9, 12, 2))),
        ("decode_graph", lambda: decode_graph_check(dev, "torch", new_tokens=4))))
    out["ok"] = (isinstance(out["kernels"], list)
                 and all(k["max_abs_err"] <= k["tol"] for k in out["kernels"])
                 and out["model"].get("grid_mismatches") == 0
                 and out["model"].get("greedy_ok") is True
                 and out["model"].get("backend_max_abs_diff", 1) <= 1e-4
                 and _decode_graph_ok(out["decode_graph"]))
    return out


def no_cuda():
    """Why this machine cannot run the GPU check, as the one JSON object the script prints."""
    return {"ok": False, "cuda_available": False, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "error": "no CUDA device: torch.cuda.is_available() is False; run on a CUDA "
                     "machine (or --cpu for the CPU-safe parts, `hybridkv check-kernels "
                     "--compile sm_80,sm_90` to compile the kernels without a GPU)"}


def gpu_ok(out):
    """The acceptance rule over the parts' results (a part that raised has an "error")."""
    graph, bw = out["graph"], out["bandwidth"]
    return (isinstance(out["kernels"], list)
            and all(k["max_abs_err"] <= k["tol"] for k in out["kernels"])
            and out["model"].get("grid_mismatches") == 0
            and out["model"].get("greedy_ok") is True
            and out["model"].get("backend_max_abs_diff", 1) <= 1e-4
            and graph.get("relocated_replay_refused") is True
            and graph.get("replay_vs_eager_max_abs_err", 1) <= 1e-5
            and graph.get("recaptured_replay_max_abs_err", 1) <= 1e-5
            and _decode_graph_ok(out["decode_graph"]) and out["decode_graph"].get("cuda") is True
            and bool(bw.get("runs")) and all("error" not in r for r in bw["runs"]))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true", help="the JSON object on one line")
    ap.add_argument("--full-grid", action="store_true",
                    help="the full resume grid (default: the quick one, to stay under 5 min)")
    ap.add_argument("--cpu", action="store_true", help="only the CPU-safe parts, on the CPU")
    args = ap.parse_args(argv)
    if args.cpu:
        out = cpu_smoke()
    elif not torch.cuda.is_available():
        out = no_cuda()
    else:
        dev = torch.device("cuda")
        out = {"device": torch.cuda.get_device_name(0)}
        t0 = time.perf_counter()
        out.update(_run_parts((
            ("kernels", lambda: check_kernels(dev)),
            ("model", lambda: check_model(dev, not args.full_grid)),
            ("bandwidth", lambda: bandwidth(dev)),
            ("graph", lambda: kernel_graph_check(dev)),
            ("decode_graph", lambda: decode_graph_check(dev)))))
        out["seconds"] = round(time.perf_counter() - t0, 1)
        out["ok"] = gpu_ok(out)
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    if "cuda_available" in out:
        return 2
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
