"""Compressor: learned gated-softmax pooling of raw rows into compressed entries.

Entry j of a compressor with ratio m and overlap ov pools rows [m*j - ov, m*j + m - 1]:
  CSA (ov = m, row width C = 2D): rows of the previous window give their low half [0, D),
      rows of the current window their high half [D, 2D);
  HCA (ov = 0, C = D): the m rows of window j, whole.
Per feature column: entry = sum_t softmax_t(gate[t] + ape[t]) * kv[t], over rows that exist
(rows before position 0 are absent, so entry 0 of CSA pools its own window only).
Closed entries are written into a paged pool; the open window stays with the caller (the tail).
"""
import torch
import triton
import triton.language as tl

from kernels.guards import (KERNEL_VERSION, LaunchRefused, check_pins, check_pool,
                            check_same_device, check_tensor, expected_abi)


@triton.jit
def _compress_kernel(KV, G, APE, POOL, BT, j0, base, C,
                     M: tl.constexpr, OV: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                     CBS: tl.constexpr):
    j = j0 + tl.program_id(0)
    t = tl.arange(0, ROWS)
    d = tl.arange(0, D)
    p = j * M - OV + t
    in_win = t < OV + M
    valid = in_win & (p >= 0)
    col = d[None, :] + tl.where(t < OV, 0, C - D)[:, None]
    row = (p - base)[:, None] * C
    kv = tl.load(KV + row + col, mask=valid[:, None], other=0.0)
    g = tl.load(G + row + col, mask=valid[:, None], other=0.0)
    g += tl.load(APE + t[:, None] * D + d[None, :], mask=in_win[:, None], other=0.0)
    g = tl.where(valid[:, None], g, float("-inf"))
    e = tl.exp(g - tl.max(g, axis=0)[None, :])
    out = tl.sum(e * kv, axis=0) / tl.sum(e, axis=0)
    blk = tl.load(BT + j // CBS)
    tl.store(POOL + blk * (CBS * D) + (j % CBS) * D + d, out)


def compress_ref(rows_kv, rows_gate, ape, pool, table, base, j0, j1, ratio, overlap):
    """Plain-torch reference: one entry at a time, explicit row and column selection."""
    d, cbs = pool.shape[2], pool.shape[1]
    for j in range(j0, j1):
        lo = j * ratio - overlap
        kv_rows, g_rows = [], []
        for p in range(max(0, lo), j * ratio + ratio):
            t = p - lo
            c0 = 0 if t < overlap else rows_kv.shape[1] - d
            kv_rows.append(rows_kv[p - base, c0:c0 + d])
            g_rows.append(rows_gate[p - base, c0:c0 + d] + ape[t])
        w = torch.softmax(torch.stack(g_rows), dim=0)
        pool[int(table[j // cbs]), j % cbs] = (w * torch.stack(kv_rows)).sum(0)


def _pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def compress(rows_kv, rows_gate, ape, pool, table, base, j0, j1, ratio, overlap, *,
             backend="triton", pins=(), stored_version=KERNEL_VERSION):
    """Write entries [j0, j1) into ``pool`` through block ``table`` (int32, padded).

    rows_kv, rows_gate: [R, C] fp32 rows for positions [base, base + R) -- the tail followed
    by the new chunk; they must cover every row the entries pool.  ape: [overlap + ratio, D].
    All checks run first; a refused launch writes nothing."""
    check_tensor("rows_kv", rows_kv, torch.float32, 2)
    check_tensor("rows_gate", rows_gate, torch.float32, 2)
    check_tensor("ape", ape, torch.float32, 2)
    d = pool.shape[2] if pool.dim() == 3 else -1
    check_pool("pool", pool, expected_abi(pool.shape[1] if pool.dim() == 3 else -1, d),
               stored_version)
    check_tensor("table", table, torch.int32, 1)
    c = rows_kv.shape[1]
    want_c = 2 * d if overlap else d
    if (rows_gate.shape != rows_kv.shape or c != want_c or d != _pow2(d)
            or tuple(ape.shape) != (overlap + ratio, d) or overlap not in (0, ratio)):
        raise LaunchRefused("shape", "rows", (tuple(rows_kv.shape), tuple(ape.shape), overlap))
    if j1 > j0:
        need_lo, need_hi = max(0, j0 * ratio - overlap), j1 * ratio
        if need_lo < base or need_hi > base + rows_kv.shape[0]:
            raise LaunchRefused("shape", "rows", (base, rows_kv.shape[0], need_lo, need_hi))
        cbs = pool.shape[1]
        if (j1 - 1) // cbs >= table.shape[0] or (table[j0 // cbs:(j1 - 1) // cbs + 1] < 0).any():
            raise LaunchRefused("shape", "table", table.tolist())
    check_same_device("compress", rows_kv, rows_gate, ape, pool, table)
    check_pins(pins)
    if j1 <= j0:
        return
    if backend == "torch":
        return compress_ref(rows_kv, rows_gate, ape, pool, table, base, j0, j1, ratio, overlap)
    if backend != "triton":
        raise LaunchRefused("shape", "backend", backend)
    _compress_kernel[(j1 - j0,)](rows_kv, rows_gate, ape, pool, table, int(j0), int(base), c,
                                 M=ratio, OV=overlap, ROWS=_pow2(ratio + overlap), D=d,
                                 CBS=pool.shape[1])
