"""bf16 / fp8 storage (kernels.lowp): each kernel, interpreted, against its torch reference in
fp32 from the same stored values, within kernels.lowp's tolerance (ATOL + one ulp of the
output's dtype x max|ref| + the tf32 rounding of p on a GPU); the launch guard's dtype pairs;
the compiled bf16 / fp8 rows."""
import pytest
import torch

from kernels import LaunchRefused, index_topk, swa_attention
from kernels.guards import check_pool
from kernels.lowp import BF16, FP8, FP8_WRITE_INTERPRETED, WRITES, cast, lowp_cases, lowp_check
from kernels.selfcheck import attention_case, indexer_case
from spec.funnel import pool_abi
from tests.kernels.test_cli import _run

CASES = lowp_cases(0)


@pytest.mark.parametrize("n", range(len(CASES)))
@pytest.mark.parametrize("kv", [BF16, FP8], ids=["bf16", "fp8"])
def test_kernel_at_low_precision_matches_fp32_reference(kv, n):
    check, case = CASES[n]
    if kv is FP8 and check in WRITES and not FP8_WRITE_INTERPRETED:
        pytest.skip("interpreter's fp32 -> e4m3 cast drops mantissa carries (kernels.lowp)")
    e = lowp_check(check, case, kv)
    assert e.max_abs_err <= e.tol, e


def test_bf16_output_dtype_and_pool_dtype_pairs():
    c = cast(attention_case(1, "swa", 2, 16, 4, 4, 6, [(10, 3)]), BF16, FP8)
    out = swa_attention(c["q"], c["swa_pool"], c["plan"], c["sink"], c["window"])
    assert out.dtype == BF16 and out.shape == c["q"].shape
    fp32_q = c["q"].float()
    with pytest.raises(LaunchRefused) as e:     # fp32 queries read fp32 pools only
        swa_attention(fp32_q, c["swa_pool"], c["plan"], c["sink"], c["window"])
    assert e.value.check == "abi" and e.value.value.dtype == "float8_e4m3fn"


def test_abi_refuses_a_pool_launch_dtype_mismatch():
    """The layout records bf16; a fp32 (or fp8) tensor under it is refused, and a layout
    recording a dtype the launch does not read is refused too."""
    pool = torch.zeros(4, 8, 16, dtype=BF16)
    check_pool("p", pool, pool_abi("bfloat16", 8, 16, 1), dtypes=("bfloat16",))
    for t in (pool.float(), pool.to(FP8)):
        with pytest.raises(LaunchRefused) as e:
            check_pool("p", t, pool_abi("bfloat16", 8, 16, 1),
                       dtypes=("bfloat16", "float8_e4m3fn"))
        assert e.value.check == "abi" and e.value.value.dtype != "bfloat16"
    with pytest.raises(LaunchRefused) as e:
        check_pool("p", pool.half(), pool_abi("float16", 8, 16, 1), dtypes=("bfloat16",))
    assert e.value.check == "abi" and e.value.value.dtype == "float16"


def test_indexer_refuses_half_queries_and_fp8_under_fp32():
    c = cast(indexer_case(4, 2, 16, 4, [(20, 3)], 3, quant=True), BF16, FP8)
    with pytest.raises(LaunchRefused) as e:
        index_topk(c["iq"].half(), c["iw"], c["keys_pool"], c["plan"], 4)
    assert (e.value.check, e.value.what) == ("dtype", "iq")
    with pytest.raises(LaunchRefused) as e:
        index_topk(c["iq"].float(), c["iw"].float(), c["keys_pool"], c["plan"], 4)
    assert e.value.check == "abi"


def test_bf16_and_fp8_compile_for_sm90_at_v4_mini(capsys):
    rc, out = _run(capsys, "--compile", "sm_90", "--shapes", "v4-mini", "--dtypes",
                       "bf16,fp8", "--json")
    assert rc == 0 and out["ok"] and len(out["compiled"]) == 14
    for r in out["compiled"]:
        assert r["ok"] and r["dtype"] == "bfloat16" and r["spill_bytes"] == 0, r
    assert {r["kv_dtype"] for r in out["compiled"]} == {"bfloat16", "float8_e4m3fn"}


@pytest.mark.slow
def test_fp8_on_sm80_is_a_named_unsupported_row(capsys):
    rc, out = _run(capsys, "--compile", "sm_80", "--shapes", "v4-mini", "--dtypes", "fp8",
                       "--json")
    assert rc == 0 and out["ok"]
    assert all(not r["ok"] and "sm_80" in r["unsupported"] for r in out["compiled"])


@pytest.mark.slow
def test_deepseek_v4_compiles_in_bf16_and_fp8(capsys):
    rc, out = _run(capsys, "--compile", "sm_80,sm_90", "--shapes", "deepseek-v4",
                       "--dtypes", "bf16,fp8", "--json")
    assert rc == 0 and out["ok"]
    for r in out["compiled"]:
        if r["kv_dtype"] == "float8_e4m3fn" and r["target"] == "sm_80":
            assert r.get("unsupported"), r
        else:
            assert r["ok"] and r["spill_bytes"] == 0, r
