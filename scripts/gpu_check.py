"""One-shot GPU check for the hybridkv kernels and the model over one memory (run on a CUDA
machine; a few minutes).

  python scripts/gpu_check.py [--json] [--quick]
  python scripts/gpu_check.py --cpu        # the CPU-safe parts only (smoke test, no GPU)

1. kernels: every kernel compiled for the GPU against its torch reference (the
   kernels.selfcheck cases moved to the GPU, including compress_batch over several requests
   in one launch, plus the 16-head tl.dot path);
2. model: V4Mini with its KV in a CacheManager on the GPU (one memory): Triton backend vs
   torch backend cold logits, then the resume grid (hybridkv.model.resume.check_grid: warm ==
   cold bitwise, resumed at the aligned H' the plan reports) and the greedy check, on Triton;
3. bandwidth: decode attention, one query per request, B requests, timed with CUDA events;
   bytes counted are the unique KV bytes each launch must read; compared with the GPU's peak;
4. graph: (a) a decode step of the kernels (indexer + sparse + HCA attention) captured as a
   CUDA graph behind kernels.GuardedGraph, replayed after refreshing its static input, checked
   against eager, then a relocated pool must be refused and a re-capture must work;
   (b) hybridkv.engine.graph.DecodeGraph over the CacheManager's pool tensors: the Engine
   decodes with the captured window gather replayed every decode step (a real
   torch.cuda.CUDAGraph; each replay compared with an eager gather), the generated tokens
   equal the cold run's argmax, a relocation of the static buffers makes the next replay
   refused and re-captured, and the replayed gather equals the pool rows of the request's
   window pages.
Prints one JSON object (--json) and exits non-zero if any comparison fails.
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


def check_kernels(dev, dot_path=True):
    from kernels.selfcheck import attention_case, check_attention, default_cases
    out = []
    cases = default_cases(0)
    if dot_path:
        cases += [(check_attention, attention_case(
            1, m, 16, 16, 16, 4, 20, [(40, 3), (700, 2)], r, top_k=80))
            for m, r in (("swa", 4), ("sparse", 4), ("hca", 8))]
    for check, case in cases:
        e = check(_to(case, dev))
        out.append({"name": e.name, "max_abs_err": e.max_abs_err, "tol": e.tol})
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
            "greedy_seconds": round(time.perf_counter() - t0, 2)}


def _decode_inputs(dev, B, L, W, nh, d, bs, ratio, top_k):
    """B requests at position L-1; SWA blocks only for the window, compressed pools full."""
    from kernels.plan import AttnPlan
    g = torch.Generator(device=dev).manual_seed(0)
    nwin = W // bs + 1
    n_log = L // bs
    swa = torch.randn(B * nwin, bs, d, device=dev, generator=g)
    swa_t = torch.full((B, -(-n_log // 4) * 4), -1, dtype=torch.int32, device=dev)
    swa_t[:, n_log - nwin:n_log] = torch.arange(B * nwin, device=dev,
                                                dtype=torch.int32).view(B, nwin)
    n_ent = L // ratio
    cbs = 16
    n_cb = -(-n_ent // cbs)
    comp = torch.randn(B * n_cb, cbs, d, device=dev, generator=g)
    comp_t = torch.randperm(B * n_cb, device=dev, generator=g).to(torch.int32).view(B, n_cb)
    comp_t = torch.nn.functional.pad(comp_t, (0, (-n_cb) % 4), value=-1).contiguous()
    sel = torch.stack([torch.randperm(n_ent, device=dev, generator=g)[:top_k]
                       for _ in range(B)]).to(torch.int32)
    pos = torch.full((B,), L - 1, dtype=torch.int32, device=dev)
    req = torch.arange(B, dtype=torch.int32, device=dev)
    plan = AttnPlan(pos, req, swa_t, comp_t, comp_t, sel, B, top_k, L - 1)
    q = torch.randn(B, nh, d, device=dev, generator=g)
    sink = torch.randn(nh, device=dev, generator=g)
    return q, swa, comp, plan, sink, n_ent


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


def bandwidth(dev, quick):
    from kernels import hca_attention, sparse_attention, swa_attention
    B, L, W, nh, d, bs, k = (256 if quick else 1024), 32768, 128, 16, 128, 16, 512
    props = torch.cuda.get_device_properties(0)
    peak = next((v for n, v in PEAK_BY_NAME.items() if n in props.name), None)
    res = {"B": B, "L": L, "W": W, "heads": nh, "head_dim": d, "top_k": k,
           "peak_bytes_per_s": peak, "runs": []}
    for mode, ratio in (("swa", 4), ("sparse", 4), ("hca", 128)):
        try:
            q, swa, comp, plan, sink, n_ent = _decode_inputs(dev, B, L, W, nh, d, bs, ratio, k)
            rows = W + {"swa": 0, "sparse": k, "hca": n_ent}[mode]
            nbytes = B * rows * d * 4 + 2 * q.numel() * 4
            fn = {"swa": lambda: swa_attention(q, swa, plan, sink, W),
                  "sparse": lambda: sparse_attention(q, swa, comp, plan, sink, W),
                  "hca": lambda: hca_attention(q, swa, comp, plan, sink, W, ratio)}[mode]
            sec = _time(fn)
            res["runs"].append({"mode": mode, "seconds": sec, "bytes": nbytes,
                                "bytes_per_s": nbytes / sec,
                                "frac_of_peak": (nbytes / sec / peak) if peak else None})
        except Exception as e:   # report and go on: one failure must not hide the rest
            res["runs"].append({"mode": mode, "error": f"{type(e).__name__}: {e}"[:500]})
    return res


def kernel_graph_check(dev):
    """A decode step of the kernels captured as a CUDA graph behind GuardedGraph."""
    from kernels import GuardedGraph, LaunchRefused, hca_attention, index_topk, sparse_attention
    B, L, W, nh, d, bs, k = 64, 4096, 128, 16, 64, 16, 64
    q, swa, comp, plan, sink, n_ent = _decode_inputs(dev, B, L, W, nh, d, bs, 4, k)
    keys = torch.randn(comp.shape[0], comp.shape[1], 16, device=dev)
    iq, iw = torch.randn(B, 4, 16, device=dev), torch.randn(B, 4, device=dev)
    outs = {}

    def step(pool):
        index_topk(iq, iw, keys, plan, 4)
        outs["sparse"] = sparse_attention(q, swa, pool, plan, sink, W)
        outs["hca"] = hca_attention(q, swa, pool, plan, sink, W, 4)

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
        ("kernels", lambda: check_kernels(dev, dot_path=False)),
        ("model", lambda: check_model(dev, True, lengths=[5, 10], span=4, greedy=(9, 12, 2))),
        ("decode_graph", lambda: decode_graph_check(dev, "torch", new_tokens=4))))
    out["ok"] = (isinstance(out["kernels"], list)
                 and all(k["max_abs_err"] <= k["tol"] for k in out["kernels"])
                 and out["model"].get("grid_mismatches") == 0
                 and out["model"].get("greedy_ok") is True
                 and out["model"].get("backend_max_abs_diff", 1) <= 1e-4
                 and _decode_graph_ok(out["decode_graph"]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smaller grid and batch")
    ap.add_argument("--cpu", action="store_true", help="only the CPU-safe parts, on the CPU")
    args = ap.parse_args(argv)
    if args.cpu:
        out = cpu_smoke()
        print(json.dumps(out) if args.json else json.dumps(out, indent=1))
        return 0 if out["ok"] else 1
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(0)}
    t0 = time.perf_counter()
    out.update(_run_parts((
        ("kernels", lambda: check_kernels(dev)),
        ("model", lambda: check_model(dev, args.quick)),
        ("bandwidth", lambda: bandwidth(dev, args.quick)),
        ("graph", lambda: kernel_graph_check(dev)),
        ("decode_graph", lambda: decode_graph_check(dev)))))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    ok = (isinstance(out["kernels"], list)
          and all(k["max_abs_err"] <= k["tol"] for k in out["kernels"])
          and out["model"].get("grid_mismatches") == 0
          and out["model"].get("greedy_ok") is True
          and out["model"].get("backend_max_abs_diff", 1) <= 1e-4
          and out["graph"].get("relocated_replay_refused") is True
          and out["graph"].get("replay_vs_eager_max_abs_err", 1) <= 1e-5
          and _decode_graph_ok(out["decode_graph"]) and out["decode_graph"].get("cuda") is True
          and all("error" not in r for r in out["bandwidth"].get("runs", [{"error": 1}])))
    out["ok"] = ok
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
