"""`hybridkv bench one-memory`: what one memory buys, measured on V4Mini through the engine.

  sharing   N requests extending one cached P-token prefix, all holding their state at once:
            KV bytes the cache holds (measured: one copy of the prefix's chain blocks, shared,
            plus each request's own snapshots and working blocks), against the previous
            design, which held the manager's objects too and, per request, a private copy of
            the whole model state at H in a model-side cache (computed from the same config:
            every compressed entry, indexer key, window row and open window of every layer)
  per hit   bytes copied to resume at H: the snapshots only (window, open windows, the open
            compressed block; measured) against the whole state at H (what the previous
            design's restore copied; computed)
  batching  engine decode tokens/s at batch 1 vs batch B (max_running), same prompts, one
            forward per step either way
"""
import time

from hybridkv.cache import CacheManager
from hybridkv.engine import Engine
from hybridkv.model import V4Mini

F32 = 4


def state_bytes(cfg, H):
    """Bytes of the whole model state at H (every layer): compressed entries, indexer keys,
    the window, and both compressors' open windows -- a private copy per request before."""
    total = 0
    for kind in cfg.layers:
        total += min(H, cfg.window) * cfg.head_dim * F32               # window rows
        if kind == "swa":
            continue
        r = cfg.ratio(kind)
        ov = r if kind == "csa" else 0
        width = 2 * cfg.head_dim if kind == "csa" else cfg.head_dim
        total += (H // r) * cfg.head_dim * F32                          # compressed entries
        total += (H - max(0, H // r * r - ov)) * 2 * width * F32        # compressor tail
        if kind == "csa":
            total += (H // cfg.csa_ratio) * cfg.idx_dim * F32           # indexer keys
            total += (H - max(0, H // r * r - r)) * 4 * cfg.idx_dim * F32  # indexer tail
    return total


def _prefix(P, seed=3):
    return [(37 * i + seed) % 250 for i in range(P)]


def sharing(P=2048, counts=(1, 4, 16), blocks=1024):
    model = V4Mini(seed=0)
    out = []
    for n in counts:
        cache = CacheManager(model.layout(), num_blocks=blocks)
        Engine(model, cache).generate([_prefix(P)], 1)          # the prefix, cached
        base = cache.kv_bytes_held()
        rids = [f"r{i}" for i in range(n)]
        for i, rid in enumerate(rids):                            # all hold their state
            plan = cache.lookup(rid, _prefix(P) + [1, i % 250, 2, 3])
            cache.allocate(rid, 4 + P - plan.reuse_tokens)
        held = cache.kv_bytes_held()
        H = cache.requests[rids[0]].plan.reuse_tokens
        private = state_bytes(model.cfg, H + 4)
        before = held + n * private
        out.append({"requests": n, "prefix_tokens": P, "resumed_at": H,
                    "kv_bytes_held": held, "cached_prefix_bytes": base,
                    "per_request_bytes": (held - base) / n, "private_copy_bytes": private,
                    "before_bytes": before, "before_over_after": before / held})
        for rid in rids:
            cache.free(rid)
    return out


def per_hit(lengths=(64, 256, 1024, 2048), blocks=1024):
    model = V4Mini(seed=0)
    out = []
    for P in lengths:
        cache = CacheManager(model.layout(), num_blocks=blocks)
        eng = Engine(model, cache)
        eng.generate([_prefix(P)], 1)
        before = cache.stats()["snapshot_bytes_copied"]["restored_on_hit"]
        eng.generate([_prefix(P) + [5, 6]], 1)
        H = eng.last_outputs[0].hits[0].reuse_tokens
        copied = cache.stats()["snapshot_bytes_copied"]["restored_on_hit"] - before
        whole = state_bytes(model.cfg, H)
        out.append({"prefix_tokens": P, "resumed_at": H, "bytes_copied": copied,
                    "before_bytes_copied": whole, "before_over_after": whole / max(copied, 1)})
    return out


def batching(batch=8, new_tokens=24, backend="torch", prompt_tokens=24):
    model = V4Mini(seed=0, backend=backend)
    prompts = [_prefix(prompt_tokens, seed=i) for i in range(batch)]
    res = {}
    for b in (1, batch):
        cache = CacheManager(model.layout(), num_blocks=512)
        eng = Engine(model, cache, max_running=b, step_tokens=8 * batch * 8)
        eng.generate([p[:4] for p in prompts], 1)                # warm the kernels
        t0 = time.perf_counter()
        eng.generate(prompts, new_tokens)
        dt = time.perf_counter() - t0
        res[b] = batch * new_tokens / dt
    return {"backend": backend, "batch": batch, "new_tokens": new_tokens,
            "tokens_per_s_batch1": res[1], f"tokens_per_s_batch{batch}": res[batch],
            "ratio": res[batch] / res[1]}


def run_all(backends=("torch", "triton")):
    return {"sharing": sharing(), "per_hit": per_hit(),
            "batching": [batching(backend=be) for be in backends]}
