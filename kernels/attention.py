"""Paged attention over the SWA pool, optionally joined by compressed entries.

One kernel, three modes (one softmax over the union, plus a per-head attention sink):
  MODE 0 "swa":    raw rows at positions [max(0, i-W+1), i] of the request's SWA blocks;
  MODE 1 "sparse": the window plus the compressed entries the indexer selected (plan.sel; -1: none);
  MODE 2 "hca":    the window plus every compressed entry j visible at i: ratio*(j+1)-1 <= i.
K and V are the same shared row (MQA-style shared KV).  The sink adds exp(sink_h) to the
softmax denominator and contributes no value.  Chunked prefill and decode are the same launch:
one program per query and block of BLOCK_H heads (all heads together where a [heads, D] tile
fits, so each KV row is loaded once per query; at D = 512 four 16-head programs share it).

Dtypes: queries fp32 or bf16; pools of that dtype, or fp8 (e4m3) under bf16 queries (see
kernels.guards.POOL_DTYPES); sink fp32 or the queries' dtype.  Every value is upcast to fp32
after its load and the softmax and accumulation run in fp32; the output has the queries' dtype
(what a serving engine feeds the next projection), rounded once at the store.  tl.dot runs in
ieee fp32 over fp32 pools and in tf32 over bf16 / fp8 ones: their values are exact in tf32, so
q . k is exact products summed in fp32 and only p (the softmax weights) is rounded to tf32.
"""
import math

import torch
import triton
import triton.language as tl

from kernels.guards import (LaunchRefused, check_act, check_pins, check_pool,
                            check_same_device, check_tensor)
from kernels.plan import TILE, Launch, pow2

MODES = {"swa": 0, "sparse": 1, "hca": 2}


@triton.jit
def _update(q, kv, valid, m, l, acc, scale, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    if USE_DOT:   # tensor-core friendly shapes; PREC: "ieee" over fp32 pools (no tf32)
        s = tl.dot(q, tl.trans(kv), input_precision=PREC) * scale
    else:
        s = tl.sum(q[:, None, :] * kv[None, :, :], axis=2) * scale      # [BLOCK_H, N]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if USE_DOT:
        acc = acc * alpha[:, None] + tl.dot(p, kv, input_precision=PREC)
    else:
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * kv[None, :, :], axis=1)
    return m_new, l, acc


@triton.jit
def _attn_kernel(Q, KV, CKV, SINK, POS, REQ, BT, CBT, SEL, OUT,
                 window, ratio, scale, bt_stride, cbt_stride, sel_stride, kv_stride, ckv_stride,
                 MODE: tl.constexpr, BS: tl.constexpr, CBS: tl.constexpr, NH: tl.constexpr,
                 D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_S: tl.constexpr, N_SEL: tl.constexpr, USE_DOT: tl.constexpr,
                 PREC: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.load(POS + pid)
    r = tl.load(REQ + pid)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + pid * NH * D + h[:, None] * D + d[None, :]).to(tl.float32)
    m = tl.load(SINK + h).to(tl.float32)       # running max starts at the sink logit
    l = tl.full([BLOCK_H], 1.0, tl.float32)    # exp(sink - m) with m == sink
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    lo = tl.maximum(i - window + 1, 0)
    for t in range(0, (i - lo + BLOCK_N) // BLOCK_N):
        p = lo + t * BLOCK_N + n
        valid = p <= i
        blk = tl.load(BT + r * bt_stride + p // BS, mask=valid, other=0)
        kv = tl.load(KV + blk[:, None] * kv_stride + (p % BS)[:, None] * D + d[None, :],
                     mask=valid[:, None], other=0.0).to(tl.float32)
        m, l, acc = _update(q, kv, valid, m, l, acc, scale, USE_DOT, PREC)
    if MODE == 1:
        s_off = tl.arange(0, BLOCK_S)
        for t in range(0, (N_SEL + BLOCK_S - 1) // BLOCK_S):
            k_off = t * BLOCK_S + s_off
            j = tl.load(SEL + pid * sel_stride + k_off, mask=k_off < N_SEL, other=-1)
            valid = j >= 0
            blk = tl.load(CBT + r * cbt_stride + j // CBS, mask=valid, other=0)
            kv = tl.load(CKV + blk[:, None] * ckv_stride + (j % CBS)[:, None] * D + d[None, :],
                         mask=valid[:, None], other=0.0).to(tl.float32)
            m, l, acc = _update(q, kv, valid, m, l, acc, scale, USE_DOT, PREC)
    if MODE == 2:
        n_vis = (i + 1) // ratio
        for t in range(0, (n_vis + BLOCK_N - 1) // BLOCK_N):
            j = t * BLOCK_N + n
            valid = j < n_vis
            blk = tl.load(CBT + r * cbt_stride + j // CBS, mask=valid, other=0)
            kv = tl.load(CKV + blk[:, None] * ckv_stride + (j % CBS)[:, None] * D + d[None, :],
                         mask=valid[:, None], other=0.0).to(tl.float32)
            m, l, acc = _update(q, kv, valid, m, l, acc, scale, USE_DOT, PREC)
    o = acc / l[:, None]
    tl.store(OUT + pid * NH * D + h[:, None] * D + d[None, :], o.to(OUT.dtype.element_ty))


def _rows(pool, table, idx, what):
    """Rows ``idx`` (logical) of a paged pool through one block table; a read of a block the
    request does not hold is a bug in the caller's state, never silently wrapped."""
    bs = pool.shape[1]
    blocks = table[idx // bs]
    if (blocks < 0).any():
        raise IndexError(f"{what}: read of an unheld block at rows {idx[blocks < 0].tolist()}")
    return pool[blocks.long(), (idx % bs).long()]


def attention_ref(mode, q, swa_pool, comp_pool, plan, sink, window, ratio=1):
    """Plain-torch reference of the kernel: explicit gather, one softmax with a sink column,
    in fp32 from the stored values; the output in the queries' dtype."""
    out = torch.empty_like(q)
    q, sink = q.float(), sink.float()
    scale = 1.0 / math.sqrt(q.shape[-1])
    for qi in range(plan.n_q):
        i, r = int(plan.pos[qi]), int(plan.req[qi])
        keys = [_rows(swa_pool, plan.swa_table[r],
                      torch.arange(max(0, i - window + 1), i + 1, device=q.device), "swa")]
        if mode == "sparse":
            j = plan.sel[qi][plan.sel[qi] >= 0].long()
            keys.append(_rows(comp_pool, plan.comp_table[r], j, "comp"))
        elif mode == "hca":
            keys.append(_rows(comp_pool, plan.comp_table[r],
                              torch.arange((i + 1) // ratio, device=q.device), "comp"))
        k = torch.cat(keys).float()
        s = torch.cat([q[qi] @ k.T * scale, sink[:, None]], dim=1)
        out[qi] = torch.softmax(s, dim=1)[:, :-1] @ k
    return out


def attention(mode, q, swa_pool, plan, sink, window, *, comp_pool=None, ratio=1,
              backend="triton", pins=(), swa_abi=None, comp_abi=None):
    """Run one attention launch over ``plan`` (see module docstring for the modes).

    q: [n_q, NH, D] fp32 or bf16; pools: [blocks, rows, D] dense, of a dtype q's reads
    (kernels.guards.POOL_DTYPES); sink: [NH] fp32 or q's dtype.  Output: q's dtype.
    Checks first (shape, the pools against ``swa_abi`` / ``comp_abi`` -- the AbiDescs the cache
    records for them, see kernels.guards.check_pool --, alignment, ``pins``) and
    raises LaunchRefused before anything runs.  Returns a new [n_q, NH, D] tensor."""
    if mode not in MODES:
        raise LaunchRefused("shape", "mode", mode)
    pool_dtypes = check_act("q", q, 3)
    n_q, nh, d = q.shape
    if n_q != plan.n_q or nh != pow2(nh) or d != pow2(d) or tuple(sink.shape) != (nh,):
        raise LaunchRefused("shape", "q", (tuple(q.shape), plan.n_q, tuple(sink.shape)))
    if sink.dtype not in (torch.float32, q.dtype):
        raise LaunchRefused("dtype", "sink", str(sink.dtype))
    check_tensor("sink", sink, sink.dtype, 1, row=False)
    check_pool("swa_pool", swa_pool, swa_abi, d, pool_dtypes)
    pools = [swa_pool]
    if mode != "swa":
        if comp_pool is None:
            raise LaunchRefused("shape", "comp_pool", None)
        check_pool("comp_pool", comp_pool, comp_abi, d, pool_dtypes)
        pools.append(comp_pool)
    for name in ("pos", "req", "swa_table", "comp_table", "sel"):
        check_tensor(name, getattr(plan, name), torch.int32, getattr(plan, name).dim())
    check_same_device("attention", q, sink, *pools, plan.pos, plan.swa_table)
    check_pins(pins)
    if backend == "torch":
        return attention_ref(mode, q, swa_pool, comp_pool, plan, sink, window, ratio)
    if backend != "triton":
        raise LaunchRefused("shape", "backend", backend)
    out = torch.empty_like(q)
    if n_q:
        attention_launch(mode, q, swa_pool, comp_pool, plan, sink, out, window, ratio).run()
    return out


def attention_launch(mode, q, swa_pool, comp_pool, plan, sink, out, window, ratio=1):
    """The Launch of one checked attention call (the run step; kernels.aot compiles it).

    Tiles: BLOCK_H heads per program, the window walked BLOCK_N rows at a time (at most 64),
    the selection BLOCK_S entries at a time, each [rows, D] fp32 tile at most TILE elements
    (32 KB: at D = 512 the tiles of 64 rows or heads would not fit in registers or shared
    memory); tl.dot once every operand is at least 16 wide (tf32 over bf16 / fp8 pools); 8
    warps for D >= 256."""
    n_q, nh, d = q.shape
    cp = comp_pool if comp_pool is not None else swa_pool
    rows = max(1, TILE // d)
    block_h = min(nh, rows)
    block_n = min(64, rows, pow2(max(window, 2)))
    block_s = min(64, rows, pow2(plan.sel.shape[1]))
    use_dot = (block_h >= 16 and d >= 16 and block_n >= 16
               and (mode != "sparse" or block_s >= 16))
    args = (q, swa_pool, cp, sink, plan.pos, plan.req, plan.swa_table, plan.comp_table, plan.sel,
            out, int(window), int(ratio), 1.0 / math.sqrt(d), plan.swa_table.stride(0),
            plan.comp_table.stride(0), plan.sel.stride(0), swa_pool.stride(0), cp.stride(0))
    meta = dict(MODE=MODES[mode], BS=swa_pool.shape[1], CBS=cp.shape[1], NH=nh, D=d,
                BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_S=block_s, N_SEL=plan.sel.shape[1],
                USE_DOT=use_dot, PREC="ieee" if swa_pool.dtype == torch.float32 else "tf32",
                num_warps=8 if d >= 256 else 4)
    return Launch(_attn_kernel, (n_q, nh // block_h), args, meta)


def swa_attention(q, swa_pool, plan, sink, window, **kw):
    """Sliding-window paged attention with sink (prefill chunk or decode)."""
    return attention("swa", q, swa_pool, plan, sink, window, **kw)


def sparse_attention(q, swa_pool, comp_pool, plan, sink, window, **kw):
    """CSA: window plus the indexer-selected compressed entries in ``plan.sel``."""
    return attention("sparse", q, swa_pool, plan, sink, window, comp_pool=comp_pool, **kw)


def hca_attention(q, swa_pool, comp_pool, plan, sink, window, ratio, **kw):
    """HCA: window plus every compressed entry visible at each query's position."""
    return attention("hca", q, swa_pool, plan, sink, window, comp_pool=comp_pool, ratio=ratio,
                     **kw)
