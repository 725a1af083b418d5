"""Lightning indexer: scores and top-k over the compressed entries visible to each query.

score(i, j) = sum_h w_h(i) * relu(q_h(i) . k_j) for j visible at i (ratio*j + ratio - 1 <= i).
Top-k is by score, ties broken by the lower entry index (both backends), so the selection is
deterministic even where relu makes many scores exactly 0.  Fewer than k visible entries leave
-1 in the remaining slots.

Dtypes: queries fp32 or bf16, keys of a dtype they read (fp8 e4m3 keys under bf16 queries:
kernels.guards.POOL_DTYPES), head weights fp32 or the queries' dtype.  Values are upcast to
fp32 after the load; scores are fp32 (tl.dot in tf32 over bf16 / fp8 operands, whose values
tf32 holds exactly, so every product is exact and only the fp32 summation order differs).
"""
import torch
import triton
import triton.language as tl

from kernels.guards import (LaunchRefused, check_act, check_pins, check_pool,
                            check_same_device, check_tensor)
from kernels.plan import TILE, Launch, pow2


@triton.jit
def _index_kernel(IQ, IW, KEYS, POS, REQ, IBT, SEL, SCORES, ratio, bt_stride, sel_stride,
                  keys_stride,
                  NI: tl.constexpr, DI: tl.constexpr, CBS: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_T: tl.constexpr, K: tl.constexpr, USE_DOT: tl.constexpr,
                  PREC: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.load(POS + pid)
    r = tl.load(REQ + pid)
    h = tl.arange(0, NI)
    d = tl.arange(0, DI)
    t = tl.arange(0, BLOCK_T)
    q = tl.load(IQ + pid * NI * DI + h[:, None] * DI + d[None, :]).to(tl.float32)
    w = tl.load(IW + pid * NI + h).to(tl.float32)
    n_vis = (i + 1) // ratio
    for e0 in range(0, BLOCK_E, BLOCK_T):     # score the row a tile of entries at a time
        e = e0 + t
        valid = e < n_vis
        blk = tl.load(IBT + r * bt_stride + e // CBS, mask=valid, other=0)
        k = tl.load(KEYS + blk[:, None] * keys_stride + (e % CBS)[:, None] * DI + d[None, :],
                    mask=valid[:, None], other=0.0).to(tl.float32)
        if USE_DOT:   # fp32 products: ieee over fp32 keys, tf32 (exact there) over bf16 / fp8
            dots = tl.dot(q, tl.trans(k), input_precision=PREC)
        else:
            dots = tl.sum(q[:, None, :] * k[None, :, :], axis=2)          # [NI, T]
        s = tl.sum(w[:, None] * tl.maximum(dots, 0.0), axis=0)
        tl.store(SCORES + pid * BLOCK_E + e, tl.where(valid, s, float("-inf")))
    tl.debug_barrier()                         # the whole row stored before it is read back
    e = tl.arange(0, BLOCK_E)
    s = tl.load(SCORES + pid * BLOCK_E + e)
    for kk in range(K):
        best = tl.min(tl.where(s == tl.max(s, axis=0), e, BLOCK_E), axis=0)
        tl.store(SEL + pid * sel_stride + kk, tl.where(kk < n_vis, best, -1))
        s = tl.where(e == best, float("-inf"), s)


def index_topk_ref(iq, iw, keys_pool, plan, ratio, block_e):
    """Plain-torch reference: gather visible keys, score in fp32, stable descending sort."""
    iq, iw = iq.float(), iw.float()
    n_q, k = plan.n_q, plan.top_k
    dev = iq.device
    scores = torch.full((max(n_q, 1), block_e), float("-inf"), device=dev)
    sel = torch.full_like(plan.sel, -1)
    cbs = keys_pool.shape[1]
    for qi in range(n_q):
        i, r = int(plan.pos[qi]), int(plan.req[qi])
        j = torch.arange((i + 1) // ratio, device=dev)
        blocks = plan.idx_table[r][j // cbs]
        if (blocks < 0).any():
            raise IndexError(f"indexer: read of an unheld block for entries {j.tolist()}")
        keys = keys_pool[blocks.long(), (j % cbs).long()].float()
        s = (iw[qi][:, None] * torch.relu(iq[qi] @ keys.T)).sum(0)
        scores[qi, :len(j)] = s
        order = torch.sort(s, descending=True, stable=True).indices[:k]
        sel[qi, :len(order)] = order.to(torch.int32)
    return scores, sel


def index_topk(iq, iw, keys_pool, plan, ratio, *, backend="triton", pins=(),
               abi=None):
    """Score and select for every query of ``plan``; fills ``plan.sel[:, :top_k]`` in place.

    iq: [n_q, NI, DI], iw: [n_q, NI], keys_pool: [blocks, rows, DI] (indexer pool); dtypes:
    the module docstring.
    Returns (scores [n_q, BLOCK_E] with -inf where not visible, sel)."""
    key_dtypes = check_act("iq", iq, 3)
    if iw.dtype not in (torch.float32, iq.dtype):
        raise LaunchRefused("dtype", "iw", str(iw.dtype))
    check_tensor("iw", iw, iw.dtype, 2, row=False)
    n_q, ni, di = iq.shape
    if (n_q != plan.n_q or tuple(iw.shape) != (n_q, ni) or ni != pow2(ni) or di != pow2(di)
            or not 0 < plan.top_k <= plan.sel.shape[1]):
        raise LaunchRefused("shape", "iq", (tuple(iq.shape), tuple(iw.shape), plan.top_k))
    check_pool("keys_pool", keys_pool, abi, di, key_dtypes)
    for name in ("pos", "req", "idx_table", "sel"):
        check_tensor(name, getattr(plan, name), torch.int32, getattr(plan, name).dim())
    check_same_device("indexer", iq, iw, keys_pool, plan.pos, plan.idx_table, plan.sel)
    check_pins(pins)
    block_e = index_block_e(plan, ratio)
    if backend == "torch":
        scores, sel = index_topk_ref(iq, iw, keys_pool, plan, ratio, block_e)
        plan.sel.copy_(sel)
        return scores, plan.sel
    if backend != "triton":
        raise LaunchRefused("shape", "backend", backend)
    scores = torch.empty((max(n_q, 1), block_e), dtype=torch.float32, device=iq.device)
    if n_q:
        index_launch(iq, iw, keys_pool, plan, ratio, scores).run()
    return scores, plan.sel


def index_block_e(plan, ratio):
    """Width of a score row: every entry visible to the plan's last position, rounded up."""
    return pow2(max(1, (plan.max_pos + 1) // ratio))


def index_launch(iq, iw, keys_pool, plan, ratio, scores):
    """The Launch scoring and selecting for every query of the checked ``plan``: the score
    row is written BLOCK_T entries at a time (the [NI, T, DI] product within kernels.plan.TILE,
    or with tl.dot 32 entries), then read back whole for the top-k."""
    n_q, ni, di = iq.shape
    block_e = scores.shape[1]
    block_t = min(block_e, max(1, TILE // (ni * di)))
    use_dot = ni >= 16 and di >= 16 and block_e >= 16
    if use_dot:   # 32: at 64 entries the FMA dot's operands spill at NI x DI = 64 x 128
        block_t = min(block_e, 32)
    return Launch(_index_kernel, (n_q,),
                  (iq, iw, keys_pool, plan.pos, plan.req, plan.idx_table, plan.sel, scores,
                   int(ratio), plan.idx_table.stride(0), plan.sel.stride(0), keys_pool.stride(0)),
                  dict(NI=ni, DI=di, CBS=keys_pool.shape[1], BLOCK_E=block_e, BLOCK_T=block_t,
                       K=plan.top_k, USE_DOT=use_dot,
                       PREC="ieee" if keys_pool.dtype == torch.float32 else "tf32",
                       num_warps=8 if ni * di >= 4096 else 4))
