"""Kernel-vs-reference cases shared by the tests (hypothesis draws the parameters) and by
``hybridkv check-kernels`` (fixed parameters).

Every case poisons with NaN each pool row the launch must not read (rows before a query's
window, rows not yet written, spare blocks) and leaves blocks that slid out of the window
unheld (-1 in the table), so a kernel reading outside its contract shows up as NaN.

Tolerances (fp32 throughout): outputs are softmax-weighted means of O(1) rows over at most a
few hundred terms, so the two backends differ only by summation order and exp rounding, a few
ulp per term: ATOL = 1e-5 bounds that with margin.  Indexer selections are compared exactly
where scores are exact (integer-valued inputs); otherwise a differing pick must be a near-tie
within ATOL in the reference scores.
"""
from typing import NamedTuple

import torch

from kernels.attention import attention, attention_ref
from kernels.compressor import CompressSlice, compress, compress_batch, compress_ref
from kernels.indexer import index_topk
from kernels.plan import SeqSlice, plan_attention

ATOL = 1e-5
NAN = float("nan")


class Err(NamedTuple):
    name: str
    max_abs_err: float
    tol: float


def _rand(g, *shape, quant=False):
    x = torch.randn(*shape, generator=g)
    return torch.round(x * 2) / 2 if quant else x


def _paged(g, n_rows_per_req, bs, d, keep_from, quant=False):
    """A poisoned pool holding, per request, rows [keep_from[r], n_rows[r]) in shuffled blocks."""
    n_blk = [-(-n // bs) for n in n_rows_per_req]
    total = sum(n_blk) + 2
    perm = torch.randperm(total, generator=g).tolist()
    pool = torch.full((total, bs, d), NAN)
    tables, k = [], 0
    for n, lo, nb in zip(n_rows_per_req, keep_from, n_blk):
        table = []
        for b in range(nb):
            phys = perm[k]
            k += 1
            if (b + 1) * bs <= lo:
                table.append(-1)
                continue
            table.append(phys)
            for row in range(bs):
                p = b * bs + row
                if lo <= p < n:
                    pool[phys, row] = _rand(g, d, quant=quant)
        tables.append(table)
    return pool, tables


def attention_case(seed, mode, nh, d, bs, cbs, window, reqs, ratio=4, top_k=4):
    """Inputs for one attention launch; ``reqs`` = [(start, n_new), ...]."""
    g = torch.Generator().manual_seed(seed)
    ends = [s + n for s, n in reqs]
    pool, swa_t = _paged(g, ends, bs, d, [max(0, s - window + 1) for s, _ in reqs])
    n_ent = [e // ratio for e in ends]
    cpool, comp_t = _paged(g, n_ent, cbs, d, [0] * len(reqs))
    plan = plan_attention([SeqSlice(s, n, st, ct) for (s, n), st, ct in zip(reqs, swa_t, comp_t)],
                          top_k)
    for qi in range(plan.n_q):
        n_vis = (int(plan.pos[qi]) + 1) // ratio
        pick = torch.randperm(n_vis, generator=g)[:top_k]
        slots = torch.randperm(plan.sel.shape[1], generator=g)[:len(pick)]
        plan.sel[qi, slots] = pick.to(torch.int32)
    q = _rand(g, plan.n_q, nh, d)
    sink = _rand(g, nh)
    return dict(mode=mode, q=q, swa_pool=pool, plan=plan, sink=sink, window=window,
                comp_pool=cpool if mode != "swa" else None, ratio=ratio)


def check_attention(case, backend="triton", ref=None, tol=ATOL):
    """The kernel on ``case`` vs attention_ref on ``ref`` (default: the same case; kernels.lowp
    passes the fp32 copy of a low-precision case and a tolerance ``tol(want)``)."""
    c, r = dict(case), dict(ref or case)
    mode = c.pop("mode")
    got = attention(mode, c["q"], c["swa_pool"], c["plan"], c["sink"], c["window"],
                    comp_pool=c["comp_pool"], ratio=c["ratio"], backend=backend)
    want = attention_ref(mode, r["q"], r["swa_pool"], r["comp_pool"], r["plan"], r["sink"],
                         r["window"], r["ratio"])
    return Err(f"attention_{mode}", _maxdiff(got.float(), want), _tol(tol, want))


def compressor_case(seed, ratio, overlap, d, cbs, start, n_new):
    """A chunk [start, start+n_new) with the tail it needs; pool and table poisoned/shuffled."""
    g = torch.Generator().manual_seed(seed)
    base = max(0, (start // ratio) * ratio - overlap)
    width = 2 * d if overlap else d
    rows = start + n_new - base
    n_ent = (start + n_new) // ratio
    nb = -(-max(n_ent, 1) // cbs) + 1
    table = torch.full((max(4, -(-nb // 4) * 4),), -1, dtype=torch.int32)
    table[:nb] = torch.randperm(nb, generator=g).to(torch.int32)
    return dict(rows_kv=_rand(g, rows, width), rows_gate=_rand(g, rows, width),
                ape=_rand(g, overlap + ratio, d), pool=torch.full((nb, cbs, d), NAN),
                table=table, base=base, j0=start // ratio, j1=n_ent, ratio=ratio,
                overlap=overlap)


def check_compressor(case, backend="triton", ref=None, tol=ATOL):
    got, want = dict(case), dict(ref or case)
    got["pool"], want["pool"] = case["pool"].clone(), want["pool"].clone()
    compress(**got, backend=backend)
    compress_ref(**want)
    name = "compressor_csa" if case["overlap"] else "compressor_hca"
    if not torch.equal(got["pool"].isnan(), want["pool"].isnan()):
        return Err(name, float("inf"), ATOL)
    return Err(name, _maxdiff(got["pool"].float(), want["pool"]), _tol(tol, want["pool"]))


def compress_batch_case(seed, ratio, overlap, d, cbs, reqs):
    """Several requests' chunks ``reqs`` = [(start, n_new), ...] closing their entries into
    one shared pool (NaN-poisoned, physical blocks shuffled across requests); each request
    has its own rows (tail + chunk) and block table."""
    g = torch.Generator().manual_seed(seed)
    width = 2 * d if overlap else d
    nbs = [-(-max((s + n) // ratio, 1) // cbs) + 1 for s, n in reqs]
    perm = torch.randperm(sum(nbs) + 2, generator=g).to(torch.int32)
    slices, k = [], 0
    for (start, n_new), nb in zip(reqs, nbs):
        base = max(0, (start // ratio) * ratio - overlap)
        rows = start + n_new - base
        table = torch.full((max(4, -(-nb // 4) * 4),), -1, dtype=torch.int32)
        table[:nb] = perm[k:k + nb]
        k += nb
        slices.append(CompressSlice(_rand(g, rows, width), _rand(g, rows, width), table, base,
                                    start // ratio, (start + n_new) // ratio))
    return dict(slices=slices, ape=_rand(g, overlap + ratio, d),
                pool=torch.full((len(perm), cbs, d), NAN), ratio=ratio, overlap=overlap)


def check_compress_batch(case, backend="triton", ref=None, tol=ATOL):
    """One ``compress_batch`` launch over every request vs ``compress_ref`` request by
    request: the same entries written (NaN pattern), values within ATOL (torch: equal)."""
    ref = ref or case
    got, want = case["pool"].clone(), ref["pool"].clone()
    compress_batch(case["slices"], case["ape"], got, case["ratio"], case["overlap"],
                   backend=backend)
    for s in ref["slices"]:
        compress_ref(s.rows_kv, s.rows_gate, ref["ape"], want, s.table, s.base, s.j0, s.j1,
                     case["ratio"], case["overlap"])
    name = "compress_batch_csa" if case["overlap"] else "compress_batch_hca"
    if not torch.equal(got.isnan(), want.isnan()):
        return Err(name, float("inf"), ATOL)
    return Err(name, _maxdiff(got.float(), want), _tol(tol, want))


def indexer_case(seed, ni, di, cbs, reqs, top_k, ratio=4, quant=False):
    g = torch.Generator().manual_seed(seed)
    n_ent = [(s + n) // ratio for s, n in reqs]
    keys, tables = _paged(g, n_ent, cbs, di, [0] * len(reqs), quant=quant)
    plan = plan_attention([SeqSlice(s, n, (), (), t) for (s, n), t in zip(reqs, tables)], top_k)
    return dict(iq=_rand(g, plan.n_q, ni, di, quant=quant), iw=_rand(g, plan.n_q, ni, quant=quant),
                keys_pool=keys, plan=plan, ratio=ratio, exact=quant)


def check_indexer(case, backend="triton", ref=None, tol=ATOL):
    """Scores within ATOL; selection equal, or (inexact inputs) differing only at near-ties."""
    c, r = dict(case), dict(ref or case)
    exact = c.pop("exact")
    r.pop("exact")
    ref_s, ref_sel = index_topk(**r, backend="torch")
    ref_sel = ref_sel.clone()
    got_s, got_sel = index_topk(**c, backend=backend)
    err = _maxdiff(got_s, ref_s)
    if not torch.equal(got_s.isinf(), ref_s.isinf()):
        err = float("inf")
    for qi in range(c["plan"].n_q):
        a, b = got_sel[qi], ref_sel[qi]
        if torch.equal(a, b):
            continue
        if exact or not torch.equal(a >= 0, b >= 0):
            return Err("indexer_topk", float("inf"), ATOL)
        kth = ref_s[qi][b[b >= 0].long()].min()
        if (ref_s[qi][a[a >= 0].long()] < kth - ATOL).any():
            return Err("indexer_topk", float("inf"), ATOL)
    return Err("indexer_topk", err, _tol(tol, ref_s))


def _tol(tol, want):
    return tol(want) if callable(tol) else tol


def _maxdiff(a, b):
    fin = a.isfinite() & b.isfinite()
    if not torch.equal(fin, b.isfinite()):
        return float("inf")
    return float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0


def default_cases(seed=0):
    """The fixed cases the CLI runs: (check function, case) pairs, one or more per kernel."""
    reqs = [(0, 7), (23, 5)]
    out = []
    for mode, ratio in (("swa", 4), ("sparse", 4), ("hca", 8)):
        out.append((check_attention, attention_case(seed, mode, 4, 16, 6, 4, 10, reqs, ratio)))
    out.append((check_attention, attention_case(seed, "swa", 4, 16, 16, 4, 128, [(300, 2)])))
    for ratio, ov, start, n in ((4, 4, 0, 9), (4, 4, 13, 11), (8, 0, 5, 27), (16, 0, 30, 40)):
        out.append((check_compressor, compressor_case(seed, ratio, ov, 16, 4, start, n)))
    for ratio, ov in ((4, 4), (8, 0)):
        out.append((check_compress_batch, compress_batch_case(
            seed, ratio, ov, 16, 4, [(0, 9), (13, 11), (40, 1), (7, 30)])))
    out.append((check_indexer, indexer_case(seed, 2, 8, 4, reqs, 4)))
    out.append((check_indexer, indexer_case(seed, 2, 8, 4, [(40, 9)], 4, quant=True)))
    return out


def shape_cases(shape, seed=0):
    """Every kernel against its reference at a kernels.shapes.KernelShape (V4-mini's or
    DeepSeek-V4's): a chunk ending at ``shape.max_pos`` beside a decode half-way, the
    compressors closing entries there, the indexer on half-integer inputs (exact scores, so
    the selection is compared exactly however many heads and dims are summed)."""
    end = shape.max_pos + 1
    reqs = [(end - 4, 4), (end // 2, 1)]
    nh, d, k = shape.n_heads, shape.head_dim, shape.top_k
    out = [(check_attention, attention_case(seed, mode, nh, d, shape.swa_rows, shape.comp_rows,
                                            shape.window, reqs, ratio, top_k=k))
           for mode, ratio in (("swa", shape.csa_ratio), ("sparse", shape.csa_ratio),
                               ("hca", shape.hca_ratio))]
    for ratio, ov, dim in ((shape.csa_ratio, shape.csa_ratio, d), (shape.hca_ratio, 0, d),
                           (shape.csa_ratio, shape.csa_ratio, shape.idx_dim)):
        out.append((check_compressor, compressor_case(seed, ratio, ov, dim, shape.comp_rows,
                                                      end - ratio - 3, ratio + 3)))
        out.append((check_compress_batch, compress_batch_case(
            seed, ratio, ov, dim, shape.comp_rows, [(0, 2 * ratio + 1), (end - ratio, ratio)])))
    out.append((check_indexer, indexer_case(seed, shape.idx_heads, shape.idx_dim,
                                            shape.comp_rows, reqs, k, shape.csa_ratio,
                                            quant=True)))
    return out
