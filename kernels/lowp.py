"""Kernel-vs-reference cases at low-precision storage: bf16 queries and rows over bf16 or fp8
(e4m3) pools, each kernel against its torch reference computed in fp32 from the same stored
values (kernels.selfcheck's cases, cast; the reference runs on their fp32 copy).

Tolerance.  Both sides read identical values and compute in fp32, so they differ by
  - the fp32 summation order and exp rounding: selfcheck.ATOL;
  - the one rounding of the result to its stored dtype (attention: the queries' bf16;
    the compressors: the pool's dtype): on a GPU round-to-nearest, at most u * |ref| (u the
    unit roundoff, bf16 2^-8); Triton 3.9's interpreter truncates fp32 -> bf16 whatever
    ``fp_downcast_rounding`` says (measured), up to one ulp = 2u: ULP * |ref| covers both;
  - on a GPU only (the interpreter computes tl.dot in fp32): tl.dot in tf32 rounds the
    softmax weights p to 11 bits, at most 2^-11 * sum_i p_i |v_i| <= 2^-11 * max |v|; keys
    and queries are exact in tf32, so the logits and the indexer's scores are exact
    products summed in fp32.
So tol = ATOL + ULP * max|ref| + 2^-11 * max|v|, per case.  The indexer runs on half-integer
inputs (exact in bf16 and, at these magnitudes, in e4m3): scores are exact, selections equal.

fp8 pools are read (upcast at the load) by attention and the indexer, exactly under the
interpreter too.  Writing fp8 (a compressor into an fp8 pool) compiles for sm_90, but the
interpreter's fp32 -> e4m3 cast drops the carry of a rounded-up mantissa (1.95 -> 1.0,
measured), so those cases are not run under it (FP8_WRITE_INTERPRETED is False).
"""
import torch

from kernels.selfcheck import (ATOL, attention_case, check_attention, check_compress_batch,
                               check_compressor, check_indexer, compress_batch_case,
                               compressor_case, indexer_case)

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
ULP = {torch.float32: 0.0, BF16: 2.0 ** -7, FP8: 2.0 ** -3}     # spacing at 1: 2u
TF32_P = 2.0 ** -11
POOLS = ("swa_pool", "comp_pool", "pool", "keys_pool")
FP8_WRITE_INTERPRETED = False
WRITES = (check_compressor, check_compress_batch)


def cast(case, act=BF16, kv=BF16):
    """``case`` with its activations (queries, rows, ape, head weights) in ``act`` and its
    pools in ``kv`` (NaN poison stays NaN in both); the sink stays fp32."""
    out = {}
    for k, v in case.items():
        if k in POOLS and v is not None:
            v = v.to(kv)
        elif k in ("q", "rows_kv", "rows_gate", "ape", "iq", "iw"):
            v = v.to(act)
        elif k == "slices":
            v = [s._replace(rows_kv=s.rows_kv.to(act), rows_gate=s.rows_gate.to(act))
                 for s in v]
        out[k] = v
    return out


def upcast(case):
    """The fp32 copy the reference runs on (same values)."""
    return cast(case, torch.float32, torch.float32)


def _vmax(case):
    vals = [case[k] for k in POOLS if case.get(k) is not None]
    return max(float(v.float().nan_to_num(0.0).abs().max()) for v in vals)


def lowp_check(check, case, kv=BF16):
    """Run ``check`` (a selfcheck check_*) on ``case`` cast to bf16 activations and ``kv``
    pools, against the reference on the fp32 copy, with this module's tolerance."""
    low = cast(case, BF16, kv)
    ref = upcast(low)
    if check is check_indexer:
        return check(low, ref=ref, tol=ATOL)
    u = ULP[BF16 if check is check_attention else kv]
    p_term = TF32_P * _vmax(ref) if check is check_attention else 0.0
    return check(low, ref=ref,
                 tol=lambda want: ATOL + u * float(want.nan_to_num(0.0).abs().max()) + p_term)


def lowp_cases(seed=0):
    """Small cases covering every kernel and path (per-element and tl.dot attention, CSA /
    HCA compressors, batched, the indexer with and without tl.dot): (check, case)."""
    reqs = [(0, 7), (23, 5)]
    out = [(check_attention, attention_case(seed, m, 4, 16, 6, 4, 10, reqs, r))
           for m, r in (("swa", 4), ("sparse", 4), ("hca", 8))]
    out += [(check_attention, attention_case(seed, m, 16, 16, 16, 4, 20, [(40, 3), (70, 2)], r,
                                             top_k=16))
            for m, r in (("swa", 4), ("sparse", 4), ("hca", 8))]
    out += [(check_compressor, compressor_case(seed, r, ov, 16, 4, s, n))
            for r, ov, s, n in ((4, 4, 13, 11), (8, 0, 5, 27))]
    out += [(check_compress_batch, compress_batch_case(seed, r, ov, 16, 4, [(0, 9), (13, 11)]))
            for r, ov in ((4, 4), (8, 0))]
    out += [(check_indexer, indexer_case(seed, ni, di, 4, reqs, 4, quant=True))
            for ni, di in ((2, 16), (16, 16))]
    return out
