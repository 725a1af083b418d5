"""Pools whose blocks lie on padded pages (the one block arena's layer views: block stride the
page, >= rows x dim, on GPU_BLOCK_ALIGN): every kernel reads and writes them through
``pool.stride(0)`` -- bit-identical to the dense pool, padding untouched -- and the launch
guard (spec.funnel.can_pad_blocks, then the one ABI rule can_hit_abi) still refuses a block
stride that is short or off the alignment, a wrong row stride, dtype, rows or dim."""
import pytest
import torch

from kernels import LaunchRefused
from kernels.attention import attention
from kernels.compressor import compress, compress_batch
from kernels.guards import check_pool, tensor_abi
from kernels.indexer import index_topk
from kernels.selfcheck import (attention_case, check_attention, check_compress_batch,
                               check_compressor, default_cases)
from spec.funnel import GPU_BLOCK_ALIGN, pool_abi

POOLS = {check_attention: ("swa_pool", "comp_pool"), check_compressor: ("pool",),
         check_compress_batch: ("pool",)}


def on_pages(pool, extra=GPU_BLOCK_ALIGN):
    """The same blocks on padded pages: block stride the dense block rounded up to
    GPU_BLOCK_ALIGN plus ``extra`` bytes, NaN in the padding.  Returns (view, page buffer)."""
    n, rows, dim = pool.shape
    size = pool.element_size()
    stride = (-(-rows * dim * size // GPU_BLOCK_ALIGN) * GPU_BLOCK_ALIGN + extra) // size
    buf = torch.full((n * stride,), float("nan"), dtype=pool.dtype)
    view = buf.as_strided(tuple(pool.shape), (stride, dim, 1))
    view.copy_(pool)
    return view, buf


def launch(fn, c):
    """Run the case's kernel (Triton, interpreted); the tensors it produced or wrote."""
    c = dict(c)
    if fn is check_attention:
        mode = c.pop("mode")
        return [attention(mode, c["q"], c["swa_pool"], c["plan"], c["sink"], c["window"],
                          comp_pool=c["comp_pool"], ratio=c["ratio"])]
    if fn is check_compressor:
        compress(**c)
        return [c["pool"]]
    if fn is check_compress_batch:
        compress_batch(c["slices"], c["ape"], c["pool"], c["ratio"], c["overlap"])
        return [c["pool"]]
    c.pop("exact")
    scores, sel = index_topk(**c)
    return [scores, sel.clone()]


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


@pytest.mark.parametrize("i", range(len(default_cases())))
def test_paged_pools_read_and_write_like_dense_ones(i):
    fn, case = default_cases(seed=3)[i]
    names = POOLS.get(fn, ("keys_pool",))
    names = [k for k in names if case[k] is not None]
    dense = {k: (v.clone() if k in names else v) for k, v in case.items()}
    paged, bufs = dict(case), []
    for k in names:
        paged[k], buf = on_pages(case[k])
        bufs.append((buf, paged[k]))
    for a, b in zip(launch(fn, dense), launch(fn, paged), strict=True):
        assert same_bits(a, b)
    for buf, view in bufs:       # the padding untouched: still NaN, every byte of it
        assert int(buf.isnan().sum()) == buf.numel() - view.numel() + int(view.isnan().sum())


@pytest.fixture
def pool():
    return attention_case(1, "swa", 2, 8, 4, 4, 6, [(10, 3)])["swa_pool"]


def test_padded_pages_read_as_the_dense_abi(pool):
    view, _ = on_pages(pool, 3 * GPU_BLOCK_ALIGN)
    assert view.stride(0) > pool.stride(0)
    assert tensor_abi(view, 1) == tensor_abi(pool, 1) == pool_abi("float32", 4, 8, 1)
    check_pool("p", view, pool_abi("float32", 4, 8, 1))


def _strided(pool, strides, extra=0):
    buf = torch.zeros(pool.shape[0] * max(strides) + extra, dtype=pool.dtype)
    return buf.as_strided(tuple(pool.shape), strides)


@pytest.mark.parametrize("strides", [(8 * 4 + 4, 8, 1),     # block stride off GPU_BLOCK_ALIGN
                                     (8 * 3, 8, 1),         # short of the dense block
                                     (64, 16, 1),           # padded pages, row stride wrong
                                     (64, 8, 2)])           # padded pages, element stride wrong
def test_bad_strides_refused_with_the_actual_strides(pool, strides):
    t = _strided(pool, strides, extra=64)
    with pytest.raises(LaunchRefused) as e:
        check_pool("p", t, pool_abi("float32", 4, 8, 1))
    assert e.value.check == "abi" and e.value.value.strides[1:] == strides[1:]
    assert e.value.value.strides[0] in (strides[0], 32)


@pytest.mark.parametrize("bad", [dict(dtype="float64"), dict(rows=8), dict(dim=16)])
def test_paged_pool_of_another_abi_refused(pool, bad):
    view, _ = on_pages(pool)
    want = dict(dtype="float32", rows=4, dim=8)
    want.update(bad)
    with pytest.raises(LaunchRefused) as e:
        check_pool("p", view, pool_abi(want["dtype"], want["rows"], want["dim"], 1))
    assert e.value.check == "abi"
