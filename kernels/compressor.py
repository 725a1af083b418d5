"""Compressor: learned gated-softmax pooling of raw rows into compressed entries.

Entry j of a compressor with ratio m and overlap ov pools rows [m*j - ov, m*j + m - 1]:
  CSA (ov = m, row width C = 2D): rows of the previous window give their low half [0, D),
      rows of the current window their high half [D, 2D);
  HCA (ov = 0, C = D): the m rows of window j, whole.
Per feature column: entry = sum_t softmax_t(gate[t] + ape[t]) * kv[t], over rows that exist
(rows before position 0 are absent, so entry 0 of CSA pools its own window only).
Closed entries are written into a paged pool; the open window stays with the caller (the tail).

Batched: ``compress_batch`` closes the entries of many requests in one launch (one program per
entry; each entry knows its request's rows and block-table row), so N requests cost one launch
per layer.  ``compress`` is the one-request case of the same launch.

Dtypes: rows (kv and gate, one dtype) and ape fp32 or bf16; the pool fp32, or under bf16 rows
bf16 or fp8 (e4m3): kernels.guards.POOL_DTYPES.  The pooling runs in fp32 after the loads and
each entry is rounded once, to the pool's dtype, at the store (the cache holds what attention
reads).
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.guards import (LaunchRefused, check_act, check_pins, check_pool,
                            check_same_device, check_tensor)
from kernels.plan import TILE, Launch, pow2


class CompressSlice(NamedTuple):
    """One request's part of a batched launch: rows for positions [base, base + R) (its tail
    followed by its new rows), entries [j0, j1) to close, its block table (int32)."""
    rows_kv: torch.Tensor
    rows_gate: torch.Tensor
    table: torch.Tensor
    base: int
    j0: int
    j1: int


@triton.jit
def _compress_kernel(KV, G, APE, POOL, BT, J, ROW0, TROW, C, bt_stride, pool_stride,
                     M: tl.constexpr, OV: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                     BLOCK_D: tl.constexpr, CBS: tl.constexpr):
    e = tl.program_id(0)
    j = tl.load(J + e)
    row0 = tl.load(ROW0 + e)          # row of position 0 of this entry's request (may be < 0)
    trow = tl.load(TROW + e)
    t = tl.arange(0, ROWS)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)    # columns pool independently
    p = j * M - OV + t
    in_win = t < OV + M
    valid = in_win & (p >= 0)
    col = d[None, :] + tl.where(t < OV, 0, C - D)[:, None]
    row = (row0 + p)[:, None] * C
    kv = tl.load(KV + row + col, mask=valid[:, None], other=0.0).to(tl.float32)
    g = tl.load(G + row + col, mask=valid[:, None], other=0.0).to(tl.float32)
    g += tl.load(APE + t[:, None] * D + d[None, :], mask=in_win[:, None],
                 other=0.0).to(tl.float32)
    g = tl.where(valid[:, None], g, float("-inf"))
    w = tl.exp(g - tl.max(g, axis=0)[None, :])
    out = tl.sum(w * kv, axis=0) / tl.sum(w, axis=0)
    blk = tl.load(BT + trow * bt_stride + j // CBS)
    tl.store(POOL + blk * pool_stride + (j % CBS) * D + d, out.to(POOL.dtype.element_ty))


def compress_ref(rows_kv, rows_gate, ape, pool, table, base, j0, j1, ratio, overlap):
    """Plain-torch reference: one entry at a time, explicit row and column selection, in
    fp32 from the stored values; each entry rounded to the pool's dtype as it is written."""
    d, cbs = pool.shape[2], pool.shape[1]
    for j in range(j0, j1):
        lo = j * ratio - overlap
        kv_rows, g_rows = [], []
        for p in range(max(0, lo), j * ratio + ratio):
            t = p - lo
            c0 = 0 if t < overlap else rows_kv.shape[1] - d
            kv_rows.append(rows_kv[p - base, c0:c0 + d].float())
            g_rows.append(rows_gate[p - base, c0:c0 + d].float() + ape[t].float())
        w = torch.softmax(torch.stack(g_rows), dim=0)
        pool[int(table[j // cbs]), j % cbs] = (w * torch.stack(kv_rows)).sum(0)


def _check_slice(i, s, pool, ape, ratio, overlap):
    check_tensor(f"rows_kv[{i}]", s.rows_kv, ape.dtype, 2)
    check_tensor(f"rows_gate[{i}]", s.rows_gate, ape.dtype, 2)
    check_tensor(f"table[{i}]", s.table, torch.int32, 1)
    d = pool.shape[2]
    c = s.rows_kv.shape[1]
    if (s.rows_gate.shape != s.rows_kv.shape or c != (2 * d if overlap else d) or d != pow2(d)
            or tuple(ape.shape) != (overlap + ratio, d) or overlap not in (0, ratio)):
        raise LaunchRefused("shape", "rows", (tuple(s.rows_kv.shape), tuple(ape.shape), overlap))
    if s.j1 > s.j0:
        need_lo, need_hi = max(0, s.j0 * ratio - overlap), s.j1 * ratio
        if need_lo < s.base or need_hi > s.base + s.rows_kv.shape[0]:
            raise LaunchRefused("shape", "rows", (s.base, s.rows_kv.shape[0], need_lo, need_hi))
        cbs, tab = pool.shape[1], s.table
        if (s.j1 - 1) // cbs >= tab.shape[0] or (tab[s.j0 // cbs:(s.j1 - 1) // cbs + 1] < 0).any():
            raise LaunchRefused("shape", "table", tab.tolist())


def compress_batch(slices, ape, pool, ratio, overlap, *, backend="triton", pins=(), abi=None):
    """Close entries [j0, j1) of every request in ``slices`` into ``pool`` in one launch.

    ape: [overlap + ratio, D], the rows' dtype; pool: [blocks, rows, D] (a layer's view of a
    comp or indexer pool), checked against ``abi``; dtypes: the module docstring.  All checks
    run first; a refused launch writes nothing."""
    check_pool("pool", pool, abi, dtypes=check_act("ape", ape, 2))
    for i, s in enumerate(slices):
        _check_slice(i, s, pool, ape, ratio, overlap)
    check_same_device("compress", ape, pool, *[t for s in slices for t in (s.rows_kv, s.table)])
    check_pins(pins)
    work = [s for s in slices if s.j1 > s.j0]
    if not work:
        return
    if backend == "torch":
        for s in work:
            compress_ref(s.rows_kv, s.rows_gate, ape, pool, s.table, s.base, s.j0, s.j1, ratio,
                         overlap)
        return
    if backend != "triton":
        raise LaunchRefused("shape", "backend", backend)
    compress_launch(work, ape, pool, ratio, overlap).run()


def compress_launch(work, ape, pool, ratio, overlap):
    """The Launch closing every entry of the checked slices ``work`` (each with j1 > j0): their
    rows concatenated, their tables padded into one int32 table, one program per entry and
    block of BLOCK_D feature columns ([ROWS, BLOCK_D] within kernels.plan.TILE: HCA's m' = 128
    rows of D = 512 would not fit one program's registers)."""
    dev = pool.device
    kv = torch.cat([s.rows_kv for s in work]) if len(work) > 1 else work[0].rows_kv
    gate = torch.cat([s.rows_gate for s in work]) if len(work) > 1 else work[0].rows_gate
    width = max(4, max(s.table.shape[0] for s in work))
    bt = torch.full((len(work), -(-width // 4) * 4), -1, dtype=torch.int32, device=dev)
    js, row0, trow, off = [], [], [], 0
    for r, s in enumerate(work):
        bt[r, :s.table.shape[0]] = s.table
        js += range(s.j0, s.j1)
        row0 += [off - s.base] * (s.j1 - s.j0)
        trow += [r] * (s.j1 - s.j0)
        off += s.rows_kv.shape[0]
    arr = torch.tensor([js, row0, trow], dtype=torch.int32, device=dev)
    rows, d = pow2(ratio + overlap), pool.shape[2]
    block_d = min(d, max(1, TILE // rows))
    return Launch(_compress_kernel, (len(js), d // block_d),
                  (kv, gate, ape, pool, bt, arr[0], arr[1], arr[2], kv.shape[1], bt.stride(0),
                   pool.stride(0)),
                  dict(M=ratio, OV=overlap, ROWS=rows, D=d, BLOCK_D=block_d, CBS=pool.shape[1]))

def compress(rows_kv, rows_gate, ape, pool, table, base, j0, j1, ratio, overlap, *,
             backend="triton", pins=(), abi=None):
    """Write entries [j0, j1) into ``pool`` through block ``table`` (int32, padded): the
    one-request case of ``compress_batch``.  rows_kv, rows_gate: [R, C] rows for positions
    [base, base + R) -- the tail followed by the new chunk; they must cover every row the
    entries pool."""
    compress_batch([CompressSlice(rows_kv, rows_gate, table, base, j0, j1)], ape, pool, ratio,
                   overlap, backend=backend, pins=pins, abi=abi)
