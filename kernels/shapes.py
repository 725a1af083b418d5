"""The model shapes the kernels are compiled at ahead of time, and one example Launch per
kernel at a shape.

A ``KernelShape`` says what a model's launches look like (head counts and dims, window,
ratios, top-k, the rows per pool block and the position a decode step reads at).  The
examples are built by the same ``*_launch`` functions the run step uses, over empty CPU
tensors of the launch's shapes and dtypes, so argument types, pointer alignment, integer
specialisation and constexprs are exactly a real launch's; only the values are missing.
"""
from typing import NamedTuple

import torch

from kernels.attention import attention_launch
from kernels.compressor import CompressSlice, compress_launch
from kernels.indexer import index_block_e, index_launch
from kernels.plan import SeqSlice, plan_attention


class KernelShape(NamedTuple):
    name: str          # "v4-mini", "deepseek-v4"
    n_heads: int       # query heads per launch (all of one query's heads in one program)
    head_dim: int      # shared K/V row width, also the compressed entries' width
    idx_heads: int     # lightning-indexer heads
    idx_dim: int       # indexer key / query width
    window: int        # sliding window W (rows)
    csa_ratio: int     # CSA compression ratio m (overlapping compressor, indexer)
    hca_ratio: int     # HCA compression ratio m' (no overlap)
    top_k: int         # entries the indexer selects per query
    swa_rows: int      # rows per SWA pool block
    comp_rows: int     # entries per compressed / indexer pool block
    max_pos: int       # position of the decode query the examples read at
    dtype: str = "float32"   # activations: queries, rows to compress (fp32 or bf16)
    kv_dtype: str = ""       # pools ("": the activations' dtype; fp8 e4m3 under bf16)


# DeepSeek-V4 attention as the issue gives it (head dim 512, indexer dim 128, window 128,
# ratios 4 and 128).  Assumed where it is silent: 64 query heads per launch (one rank's share),
# a 64 x 128 indexer selecting 512 entries, 128-row window pages, 64-entry compressed blocks
# and a decode at position 8191 (8K context: 2048 CSA entries in the indexer's score row).
# Its dtypes (bf16, fp8 KV) are DTYPES' variants of it (``with_dtypes``).
DEEPSEEK_V4 = KernelShape("deepseek-v4", n_heads=64, head_dim=512, idx_heads=64, idx_dim=128,
                          window=128, csa_ratio=4, hca_ratio=128, top_k=512, swa_rows=128,
                          comp_rows=64, max_pos=8191)

KERNELS = ("attention_swa", "attention_sparse", "attention_hca", "compress_csa",
           "compress_hca", "compress_index", "index_topk")

N_QUERIES = 4      # queries per example launch (decode of four requests' worth of rows)

# the dtype variants compiled: name -> (activations, pools) (kernels.guards.POOL_DTYPES)
DTYPES = {"fp32": ("float32", "float32"), "bf16": ("bfloat16", "bfloat16"),
          "fp8": ("bfloat16", "float8_e4m3fn")}


def with_dtypes(shape, name):
    """``shape`` with the activation / pool dtypes DTYPES names ``name``."""
    act, kv = DTYPES[name]
    return shape._replace(dtype=act, kv_dtype=kv)


def _dt(shape, pool=False):
    return getattr(torch, shape.kv_dtype if pool and shape.kv_dtype else shape.dtype)


def _blocks(n_rows, rows_per_block):
    return -(-max(n_rows, 1) // rows_per_block)


def _plan(shape):
    """N_QUERIES queries ending at max_pos, every block of their tables held."""
    start = shape.max_pos - N_QUERIES + 1
    n_csa = (shape.max_pos + 1) // shape.csa_ratio
    n_hca = (shape.max_pos + 1) // shape.hca_ratio
    comp_blocks = _blocks(max(n_csa, n_hca), shape.comp_rows)
    seq = SeqSlice(start, N_QUERIES, range(_blocks(shape.max_pos + 1, shape.swa_rows)),
                   range(comp_blocks), range(_blocks(n_csa, shape.comp_rows)))
    return plan_attention([seq], shape.top_k)


def _compress(shape, ratio, overlap, dim):
    """One entry closing (the decode step at the end of a window) into a one-block pool."""
    width = 2 * dim if overlap else dim
    rows = torch.empty(ratio + overlap, width, dtype=_dt(shape))
    table = torch.zeros(4, dtype=torch.int32)
    j = 1                         # entry 1: its rows all exist, base = ratio - overlap
    work = [CompressSlice(rows, torch.empty_like(rows), table, ratio - overlap, j, j + 1)]
    pool = torch.empty(2, shape.comp_rows, dim, dtype=_dt(shape, pool=True))
    return compress_launch(work, torch.empty(ratio + overlap, dim, dtype=_dt(shape)), pool,
                           ratio, overlap)


def example_launch(kernel, shape):
    """The Launch ``kernel`` (one of KERNELS) makes at ``shape``, over empty CPU tensors."""
    plan = _plan(shape)
    nh, d = shape.n_heads, shape.head_dim
    act, kv = _dt(shape), _dt(shape, pool=True)
    if kernel.startswith("attention_"):
        mode = kernel.removeprefix("attention_")
        q, sink = torch.empty(N_QUERIES, nh, d, dtype=act), torch.empty(nh)
        swa = torch.empty(plan.swa_table.shape[1], shape.swa_rows, d, dtype=kv)
        comp = None if mode == "swa" else torch.empty(plan.comp_table.shape[1],
                                                      shape.comp_rows, d, dtype=kv)
        ratio = {"swa": 1, "sparse": 1, "hca": shape.hca_ratio}[mode]   # as V4Mini passes
        return attention_launch(mode, q, swa, comp, plan, sink, torch.empty_like(q),
                                shape.window, ratio)
    if kernel == "compress_csa":
        return _compress(shape, shape.csa_ratio, shape.csa_ratio, d)
    if kernel == "compress_hca":
        return _compress(shape, shape.hca_ratio, 0, d)
    if kernel == "compress_index":
        return _compress(shape, shape.csa_ratio, shape.csa_ratio, shape.idx_dim)
    if kernel == "index_topk":
        iq = torch.empty(N_QUERIES, shape.idx_heads, shape.idx_dim, dtype=act)
        keys = torch.empty(plan.idx_table.shape[1], shape.comp_rows, shape.idx_dim, dtype=kv)
        scores = torch.empty(N_QUERIES, index_block_e(plan, shape.csa_ratio))
        return index_launch(iq, torch.empty(N_QUERIES, shape.idx_heads, dtype=act), keys, plan,
                            shape.csa_ratio, scores)
    raise KeyError(f"no kernel {kernel!r}; kernels: {', '.join(KERNELS)}")


def decode_inputs(shape, B, L, ratio, device="cpu", seed=0):
    """A decode step of B requests at position L-1 at ``shape`` (for timing and graph capture):
    random queries and sinks, a SWA pool holding only each request's window blocks, a full
    compressed pool of its L // ratio entries in shuffled blocks, and a plan (plan_attention)
    whose ``sel`` holds top_k random visible entries.
    Returns (q, swa_pool, comp_pool, plan, sink, n_ent)."""
    g = torch.Generator().manual_seed(seed)
    bs, cbs, d = shape.swa_rows, shape.comp_rows, shape.head_dim
    n_log = L // bs + 1
    nwin = min(n_log, shape.window // bs + 2)
    n_ent = L // ratio
    n_cb = -(-n_ent // cbs)
    comp_ids = torch.randperm(B * n_cb, generator=g).view(B, n_cb).tolist()
    seqs = [SeqSlice(L - 1, 1, [-1] * (n_log - nwin) + list(range(r * nwin, (r + 1) * nwin)),
                     comp_ids[r], comp_ids[r]) for r in range(B)]
    plan = plan_attention(seqs, shape.top_k)
    k = min(shape.top_k, n_ent)
    plan.sel[:, :k] = torch.stack([torch.randperm(n_ent, generator=g)[:k]
                                   for _ in range(B)]).to(torch.int32)
    plan = plan._replace(**{f: getattr(plan, f).to(device) for f in
                            ("pos", "req", "swa_table", "comp_table", "idx_table", "sel")})
    gen = torch.Generator(device=device).manual_seed(seed)
    swa = torch.randn(B * nwin, bs, d, device=device, generator=gen)
    comp = torch.randn(B * n_cb, cbs, d, device=device, generator=gen)
    q = torch.randn(B, shape.n_heads, d, device=device, generator=gen)
    sink = torch.randn(shape.n_heads, device=device, generator=gen)
    return q, swa, comp, plan, sink, n_ent
