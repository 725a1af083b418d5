"""Launch refusals: every wrapper checks ABI, alignment, pins and topology first, raises
kernels.LaunchRefused naming the check and the offending value, and changes nothing."""
import pytest
import torch

from kernels import GuardedGraph, LaunchRefused, PinCheck, compress, index_topk, swa_attention
from kernels.guards import check_pool
from spec.funnel import pool_abi
from kernels.selfcheck import attention_case, compressor_case, indexer_case
from spec.funnel import AbiDesc


@pytest.fixture
def case():
    return attention_case(1, "swa", 2, 8, 4, 4, 6, [(10, 3)])


def _run(c, **kw):
    args = dict(q=c["q"], swa_pool=c["swa_pool"], plan=c["plan"], sink=c["sink"],
                window=c["window"])
    args.update(kw)
    return swa_attention(args.pop("q"), args.pop("swa_pool"), args.pop("plan"), args.pop("sink"),
                         args.pop("window"), **args)


def _misaligned(t):
    flat = torch.empty(t.numel() + 4, dtype=t.dtype)
    v = flat[1:1 + t.numel()].view(t.shape)
    v.copy_(t)
    return v


def test_accepts_good_launch(case):
    assert _run(case, backend="torch").shape == case["q"].shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_wrong_pool_dtype(case, dtype):
    with pytest.raises(LaunchRefused) as e:
        _run(case, swa_pool=case["swa_pool"].to(dtype))
    assert e.value.check == "abi" and isinstance(e.value.value, AbiDesc)
    assert e.value.value.dtype == str(dtype).removeprefix("torch.")


def test_wrong_q_dtype(case):
    with pytest.raises(LaunchRefused) as e:
        _run(case, q=case["q"].double())
    assert (e.value.check, e.value.what, e.value.value) == ("dtype", "q", "torch.float64")


def test_pool_strides_refused(case):
    pool = case["swa_pool"].transpose(0, 1).contiguous().transpose(0, 1)  # other strides
    with pytest.raises(LaunchRefused) as e:
        _run(case, swa_pool=pool)
    assert e.value.check == "abi" and e.value.value.strides == tuple(pool.stride())


def test_head_dim_mismatch(case):
    q = torch.randn(case["q"].shape[0], 2, 4)
    with pytest.raises(LaunchRefused) as e:
        _run(case, q=q)
    assert e.value.check == "abi" and e.value.value.head_dim == 8


def test_stale_kernel_version(case):
    """The cache says the pool's objects were written by kernel version 0: refused."""
    pool = case["swa_pool"]
    old = pool_abi("float32", pool.shape[1], pool.shape[2], 0)
    with pytest.raises(LaunchRefused) as e:
        _run(case, swa_abi=old)
    assert e.value.check == "abi" and e.value.value.kernel_version == 0


def test_layout_abi_is_the_launch_abi():
    """One vocabulary: the AbiDesc the layout records for a pool is what the launch accepts;
    a layout descriptor that disagrees with the tensor (rows) is refused."""
    from hybridkv.layout import ModelLayout
    lay = ModelLayout.v4_mini()
    g = lay.group("csa")
    rows, dim = lay.pool_tensors("comp", g)["kv"]
    pool = torch.zeros(8, rows, dim)
    check_pool("comp_pool", pool, lay.abi("comp", g))
    with pytest.raises(LaunchRefused):
        check_pool("comp_pool", torch.zeros(8, rows * 2, dim), lay.abi("comp", g))


@pytest.mark.parametrize("which", ["q", "swa_pool"])
def test_misaligned_address(case, which):
    bad = _misaligned(case[which])
    with pytest.raises(LaunchRefused) as e:
        _run(case, **{which: bad})
    assert e.value.check == "bytes" and e.value.what == which
    assert e.value.value[0] == bad.data_ptr() and bad.data_ptr() % 16 != 0


@pytest.mark.parametrize("pin,field", [
    (PinCheck(1, 3, 4, 100, 100), "stale version"),
    (PinCheck(1, 3, 3, 100, 228), "moved address"),
    (PinCheck(0, 3, 3, 100, 100), "not pinned")])
def test_pin_refusals(case, pin, field):
    with pytest.raises(LaunchRefused) as e:
        _run(case, pins=[PinCheck(1, 0, 0, 5, 5), pin])
    assert e.value.check == "pinned" and e.value.value == pin, field


def test_pin_ok_passes(case):
    _run(case, pins=[PinCheck(2, 7, 7, 64, 64)], backend="torch")


def test_moved_pool_address_from_real_tensors(case):
    """The epoch is the pool's address: a relocated pool (same contents) fails the pin."""
    pinned_ep = case["swa_pool"].data_ptr()
    moved = case["swa_pool"].clone()
    with pytest.raises(LaunchRefused) as e:
        _run(case, swa_pool=moved, pins=[PinCheck(1, 1, 1, pinned_ep, moved.data_ptr())])
    assert e.value.value.pinned_ep != e.value.value.ep


def test_refused_compress_writes_nothing():
    c = compressor_case(2, 4, 4, 8, 2, 5, 10)
    before = c["pool"].clone()
    for bad in (dict(rows_kv=_misaligned(c["rows_kv"])), dict(abi=pool_abi("float32", 4, 8, 9)),
                dict(pins=[PinCheck(1, 1, 2, 0, 0)]), dict(base=c["base"] + 1)):
        with pytest.raises(LaunchRefused):
            compress(**{**c, **bad})
        assert torch.equal(before.isnan(), c["pool"].isnan())


def test_refused_indexer_leaves_selection():
    c = indexer_case(4, 2, 8, 4, [(20, 3)], 3)
    sel = c["plan"].sel.clone()
    with pytest.raises(LaunchRefused) as e:
        index_topk(c["iq"].half(), c["iw"], c["keys_pool"], c["plan"], 4)
    assert e.value.check == "dtype" and torch.equal(sel, c["plan"].sel)


def test_graph_replay_topology_guard():
    calls = []
    a, b = torch.zeros(8), torch.zeros(8)
    g = GuardedGraph(lambda: calls.append(1), {"kv": a, "out": b})
    g.replay({"kv": a, "out": b})
    assert calls == [1]
    moved = a.clone()
    with pytest.raises(LaunchRefused) as e:
        g.replay({"kv": moved, "out": b})
    assert e.value.check == "replay" and e.value.value[1][0] == moved.data_ptr()
    assert calls == [1]
