"""Bookkeeping bytes per block: hybridkv's CacheManager vs vLLM's BlockPool (KVCacheBlock).

Same method on both sides (tracemalloc, Python allocations only; no KV tensors: hybridkv's pools
on the meta device, vLLM's BlockPool holds none):
  empty   bytes the structure takes per block right after construction (hybridkv: the spec
          record, free list, slot and ABI entries of every pool block; vLLM: a KVCacheBlock
          and its free-queue links);
  cached  extra bytes per block once every block is published and cached (hybridkv: index
          entry and keys, checkpoint record, policy entry, evictor sets; vLLM: the block hash
          and its hash -> block map entry).
Layout: ModelLayout.full(block_size=16) vs vLLM full attention, block 16 (one pool each).

    python scripts/bookkeeping_bytes.py [--blocks N] [--vllm-python PATH]
"""
import argparse
import json
import os
import subprocess
import sys
import tracemalloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

VLLM_SIDE = r"""
import json, sys, tracemalloc
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id
n = int(sys.argv[1])
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
pool = BlockPool(n, True, 16)
empty = tracemalloc.get_traced_memory()[0] - base
blocks = pool.get_new_blocks(n - 1)           # the null block is taken at construction
for i, blk in enumerate(blocks):
    key = make_block_hash_with_group_id(BlockHash(i.to_bytes(32, "little")), 0)
    blk.set_block_hash(key, num_tokens=16 * (i + 1))
    pool.cached_block_hash_to_block.insert(key, blk)
pool.free_blocks(reversed(blocks))            # cached and evictable, as a freed request's
cached = tracemalloc.get_traced_memory()[0] - base - empty
print(json.dumps({"empty": empty / n, "cached": cached / (n - 1), "cached_blocks": n - 1}))
"""


def hybridkv_side(n):
    from hybridkv.cache import CacheManager
    from hybridkv.layout import ModelLayout
    layout = ModelLayout.full(block_size=16)
    per_request = 64
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    mgr = CacheManager(layout, num_blocks=n, device="meta")
    empty = tracemalloc.get_traced_memory()[0] - base
    for r in range(n // per_request - 1):     # no eviction: one request's worth stays free
        tokens = [(r * 7919 + i) % 30000 for i in range(16 * per_request)]
        plan = mgr.lookup(r, tokens)
        a = mgr.allocate(r, len(tokens) - plan.reuse_tokens)
        mgr.commit(r, a.end - a.start)
        mgr.free(r)
    cached_blocks = sum(len(s) for s in mgr.evictor.cached.values())
    cached = tracemalloc.get_traced_memory()[0] - base - empty
    tracemalloc.stop()
    return {"empty": empty / n, "cached": cached / cached_blocks, "cached_blocks": cached_blocks}


def vllm_side(n, python):
    if python is None or not os.access(python, os.X_OK):
        return {"skipped": f"no vLLM python at {python!r}"}
    proc = subprocess.run([python, "-I", "-c", VLLM_SIDE, str(n)], capture_output=True,
                          text=True, timeout=600)
    if proc.returncode:
        return {"skipped": proc.stderr[-2000:]}
    return json.loads(proc.stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=16384)
    ap.add_argument("--vllm-python", default=os.environ.get("HYBRIDKV_VLLM_PYTHON") or
                    os.path.join(os.path.dirname(REPO), "vllm-venv", "bin", "python"))
    args = ap.parse_args(argv)
    out = {"blocks": args.blocks, "hybridkv": hybridkv_side(args.blocks),
           "vllm": vllm_side(args.blocks, args.vllm_python)}
    print(json.dumps(out, indent=1))
    for side in ("hybridkv", "vllm"):
        s = out[side]
        if "skipped" not in s:
            print(f"{side:9s} bytes per block: {s['empty']:7.1f} empty, +{s['cached']:7.1f} "
                  f"once cached ({s['cached_blocks']} cached blocks)", file=sys.stderr)


if __name__ == "__main__":
    main()
