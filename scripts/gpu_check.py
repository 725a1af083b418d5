"""One-shot GPU check for the hybridkv kernels (run on a CUDA machine; ~2-4 minutes).

  python scripts/gpu_check.py [--json] [--quick]

1. compiles every kernel and compares it with its torch reference (kernels.selfcheck cases,
   moved to the GPU, plus the 16-head tl.dot path);
2. V4Mini on the GPU: Triton backend vs torch backend logits, and the resume grid on Triton;
3. decode bandwidth: one query per request, B requests, timed with CUDA events; bytes counted
   are the unique KV bytes each launch must read; compared with the GPU's peak bandwidth;
4. captures a decode step (indexer + the three attentions) as a CUDA graph behind
   kernels.GuardedGraph, replays it after refreshing the static inputs, checks it against
   eager, then relocates a pool and checks that the replay is refused and a re-capture works.
Prints one JSON object (--json) and exits non-zero if any comparison fails.
"""
import argparse
import json
import sys
import time

import torch

PEAK_BY_NAME = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_to(v, dev) for v in x])
    return x


def check_kernels(dev):
    from kernels.selfcheck import attention_case, check_attention, default_cases
    out = []
    cases = default_cases(0) + [(check_attention, attention_case(
        1, m, 16, 16, 16, 4, 20, [(40, 3), (700, 2)], r, top_k=80))
        for m, r in (("swa", 4), ("sparse", 4), ("hca", 8))]
    for check, case in cases:
        e = check(_to(case, dev))
        out.append({"name": e.name, "max_abs_err": e.max_abs_err, "tol": e.tol})
    return out


def check_model(dev, quick):
    from hybridkv.model import SeqState, V4Mini
    from hybridkv.model.resume import check_grid, grid_lengths, prompt_tokens
    tri, ref = V4Mini(0, "triton", dev), V4Mini(0, "torch", dev)
    toks = prompt_tokens(tri.cfg, 40)
    a = tri.prefill(toks, SeqState(tri.new_cache()), 7)
    b = ref.prefill(toks, SeqState(ref.new_cache()), 7)
    lengths = [3, 4, 5, 16, 17, 33] if quick else grid_lengths(tri.cfg)
    t0 = time.perf_counter()
    g = check_grid(tri, lengths)
    return {"backend_max_abs_diff": float((a - b).abs().max()), "grid_lengths": lengths,
            "grid_mismatches": g.mismatches, "grid_seconds": round(time.perf_counter() - t0, 2)}


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


def graph_check(dev):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smaller grid and batch")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(0)}
    t0 = time.perf_counter()
    for name, fn in (("kernels", lambda: check_kernels(dev)),
                     ("model", lambda: check_model(dev, args.quick)),
                     ("bandwidth", lambda: bandwidth(dev, args.quick)),
                     ("graph", lambda: graph_check(dev))):
        t = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"[:1000]}
        print(f"{name}: {time.perf_counter() - t:.1f}s", file=sys.stderr)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    ok = (isinstance(out["kernels"], list)
          and all(k["max_abs_err"] <= k["tol"] for k in out["kernels"])
          and out["model"].get("grid_mismatches") == 0
          and out["model"].get("backend_max_abs_diff", 1) <= 1e-4
          and out["graph"].get("relocated_replay_refused") is True
          and out["graph"].get("replay_vs_eager_max_abs_err", 1) <= 1e-5
          and all("error" not in r for r in out["bandwidth"].get("runs", [{"error": 1}])))
    out["ok"] = ok
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
