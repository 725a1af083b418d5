"""Each Triton kernel (interpreted on CPU) against its plain-torch reference.

Shapes, block tables (shuffled physical blocks, slid-out blocks unheld), lengths and chunk
positions are drawn by hypothesis; pools are NaN-poisoned wherever a kernel must not read.
Tolerance: kernels.selfcheck.ATOL = 1e-5 (fp32; softmax-weighted means of O(1) rows over a
few dozen terms differ between backends only by summation order -- observed <= 4e-7).
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kernels.attention import attention, attention_ref
from kernels.compressor import compress
from kernels.selfcheck import (ATOL, attention_case, check_attention, check_compress_batch,
                               check_compressor, check_indexer, compress_batch_case,
                               compressor_case, indexer_case, shape_cases)

FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
DEEP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


reqs_st = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), min_size=1, max_size=2)
attn_st = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**16), mode=st.sampled_from(["swa", "sparse", "hca"]),
    nh=st.sampled_from([1, 2, 4]), d=st.sampled_from([4, 8, 16]), bs=st.integers(1, 8),
    cbs=st.integers(1, 5), window=st.integers(1, 12), reqs=reqs_st,
    ratio=st.sampled_from([2, 4, 8]), top_k=st.integers(1, 5)))
comp_st = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**16), ratio_ov=st.sampled_from([(4, 4), (2, 2), (8, 0), (4, 0)]),
    d=st.sampled_from([4, 8, 16]), cbs=st.integers(1, 5), start=st.integers(0, 40),
    n_new=st.integers(1, 20)))
batch_st = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**16), ratio_ov=st.sampled_from([(4, 4), (2, 2), (8, 0), (4, 0)]),
    d=st.sampled_from([4, 8, 16]), cbs=st.integers(1, 5),
    reqs=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 20)), min_size=2, max_size=5)))
idx_st = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**16), ni=st.sampled_from([1, 2, 4]), di=st.sampled_from([4, 8]),
    cbs=st.integers(1, 5), reqs=reqs_st, top_k=st.integers(1, 6), quant=st.booleans()))


def _attn(p):
    return check_attention(attention_case(**p))


def _comp(p):
    (ratio, ov), p = p["ratio_ov"], {k: v for k, v in p.items() if k != "ratio_ov"}
    return check_compressor(compressor_case(ratio=ratio, overlap=ov, **p))


def _batch(p, backend="triton"):
    (ratio, ov), p = p["ratio_ov"], {k: v for k, v in p.items() if k != "ratio_ov"}
    return check_compress_batch(compress_batch_case(ratio=ratio, overlap=ov, **p), backend)


def _idx(p):
    return check_indexer(indexer_case(**p))


@FAST
@given(attn_st)
def test_attention_matches_reference(p):
    e = _attn(p)
    assert e.max_abs_err <= ATOL, (p, e)


@FAST
@given(comp_st)
def test_compressor_matches_reference(p):
    e = _comp(p)
    assert e.max_abs_err <= ATOL, (p, e)


@FAST
@given(batch_st)
def test_compress_batch_matches_per_request_reference(p):
    """One launch over several requests == compress_ref request by request (Triton)."""
    e = _batch(p)
    assert e.max_abs_err <= ATOL, (p, e)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("ratio,ov", [(4, 4), (8, 0)])
def test_compress_batch_both_backends(backend, ratio, ov):
    """Four requests (one closing nothing) in one launch, both backends; torch is the
    reference itself, so it must be exact."""
    c = compress_batch_case(3, ratio, ov, 16, 4, [(0, 9), (13, 11), (40, 1), (7, 30)])
    e = check_compress_batch(c, backend)
    assert e.max_abs_err <= (0.0 if backend == "torch" else ATOL), e


def test_compress_batch_harness_catches_a_swapped_table():
    """Negative control: the batch written through another request's table differs."""
    c = compress_batch_case(4, 4, 4, 8, 2, [(0, 12), (4, 12)])
    s0, s1 = c["slices"]
    swapped = dict(c, slices=[s0._replace(table=s1.table), s1._replace(table=s0.table)])
    got = c["pool"].clone()
    from kernels.compressor import compress_batch
    compress_batch(swapped["slices"], c["ape"], got, 4, 4)
    want = c["pool"].clone()
    compress_batch(c["slices"], c["ape"], want, 4, 4)
    assert not torch.equal(got.nan_to_num(), want.nan_to_num())


@FAST
@given(idx_st)
def test_indexer_matches_reference(p):
    e = _idx(p)
    assert e.max_abs_err <= ATOL, (p, e)


def test_decode_long_window():
    """W = 128 (V4's window) with a 16-row block: several window tiles per query."""
    e = check_attention(attention_case(3, "swa", 4, 16, 16, 4, 128, [(300, 1), (129, 2)]))
    assert e.max_abs_err <= ATOL


@pytest.mark.parametrize("mode,ratio", [("swa", 4), ("sparse", 4), ("hca", 8)])
def test_dot_path(mode, ratio):
    """16 heads x 16 dims x 16-row tiles switch the kernel to tl.dot (ieee fp32)."""
    c = attention_case(11, mode, 16, 16, 16, 4, 20, [(40, 3), (70, 2)], ratio, top_k=16)
    assert check_attention(c).max_abs_err <= ATOL


def test_harness_catches_a_wrong_window():
    """A kernel reading one row past its window must not pass (NaN poison or value change)."""
    c = attention_case(5, "swa", 2, 8, 4, 4, 6, [(20, 3)])
    got = attention("swa", c["q"], c["swa_pool"], c["plan"], c["sink"], 7)
    want = attention_ref("swa", c["q"], c["swa_pool"], None, c["plan"], c["sink"], 6)
    assert not torch.allclose(got, want, atol=ATOL)


def test_compressor_writes_only_its_entries():
    """Exactly entries [j0, j1) are written; every other pool row stays NaN."""
    c = compressor_case(7, 4, 4, 8, 2, 9, 6)     # only entry 2 closes in [9, 15)
    assert check_compressor(c).max_abs_err <= ATOL
    pool = c["pool"].clone()
    compress(**{**c, "pool": pool})
    written = {int(b) * pool.shape[1] + r for b, r in (~pool.isnan().all(-1)).nonzero().tolist()}
    table = c["table"].tolist()
    want = {table[j // 2] * 2 + j % 2 for j in range(c["j0"], c["j1"])}
    assert (c["j0"], c["j1"]) == (2, 3) and written == want


@pytest.mark.slow
@DEEP
@given(attn_st)
def test_attention_deep(p):
    assert _attn(p).max_abs_err <= ATOL


@pytest.mark.slow
@DEEP
@given(comp_st)
def test_compressor_deep(p):
    assert _comp(p).max_abs_err <= ATOL


@pytest.mark.slow
@DEEP
@given(batch_st)
def test_compress_batch_deep(p):
    assert _batch(p).max_abs_err <= ATOL


@pytest.mark.slow
@DEEP
@given(idx_st)
def test_indexer_deep(p):
    assert _idx(p).max_abs_err <= ATOL


@pytest.mark.parametrize("mode,ratio", [("swa", 4), ("sparse", 4), ("hca", 8)])
def test_head_tiles_at_head_dim_512(mode, ratio):
    """D = 512 (DeepSeek-V4): 32 heads run as two 16-head programs per query, the window in
    16-row tiles (kernels.plan.TILE), the tl.dot path on."""
    c = attention_case(13, mode, 32, 512, 8, 4, 40, [(45, 2)], ratio, top_k=16)
    assert check_attention(c).max_abs_err <= ATOL


@pytest.mark.parametrize("ratio,ov,d", [(128, 0, 128), (16, 16, 512)])
def test_compressor_column_tiles(ratio, ov, d):
    """[rows, D] beyond one tile: the feature columns are pooled in several programs."""
    c = compressor_case(17, ratio, ov, d, 2, ratio - 3, ratio + 5)
    assert check_compressor(c).max_abs_err <= ATOL


@pytest.mark.parametrize("ni,di", [(4, 64), (16, 16)])
def test_indexer_entry_tiles(ni, di):
    """A score row of 128 entries written a tile at a time (the [NI, T, DI] product, and the
    tl.dot path), then read back whole for the top-k."""
    c = indexer_case(19, ni, di, 8, [(300, 2), (257, 1)], 16, quant=True)
    assert check_indexer(c).max_abs_err <= ATOL


def _shape_case_errors(shape):
    return [check(case) for check, case in shape_cases(shape)]


def test_every_kernel_at_v4_mini_shape():
    """selfcheck.shape_cases (what scripts/gpu_check.py runs on the GPU) at V4-mini's shape."""
    from hybridkv.commands.check_kernels import v4_mini_shape
    errs = _shape_case_errors(v4_mini_shape())
    assert len(errs) == 10 and all(e.max_abs_err <= ATOL for e in errs), errs


@pytest.mark.slow
def test_every_kernel_at_deepseek_v4_shape():
    """Head dim 512, 64 heads, indexer 64 x 128 selecting 512 at position 8191 (~20 s)."""
    from kernels.shapes import DEEPSEEK_V4
    errs = _shape_case_errors(DEEPSEEK_V4)
    assert len(errs) == 10 and all(e.max_abs_err <= ATOL for e in errs), errs
