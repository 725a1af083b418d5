"""Ahead-of-time compilation (kernels.aot, `hybridkv check-kernels --compile`): every kernel
compiled for sm_90 at V4-mini's shapes in the default tier, so a kernel that stops compiling
(or starts spilling, or outgrows the device) fails here; DeepSeek-V4's shapes and sm_80 in the
slow tier.  No GPU needed: Triton compiles to a cubin for a named target on the CPU."""
import argparse
import json

import pytest

from hybridkv.commands import check_kernels
from kernels.aot import (SHARED_LIMIT, AotUnavailable, compile_in_subprocess, compile_launch,
                         parse_targets)
from kernels.shapes import DEEPSEEK_V4, KERNELS, example_launch


def _cli(capsys, *argv):
    p = argparse.ArgumentParser()
    check_kernels.add_arguments(p)
    rc = check_kernels.run(p.parse_args(list(argv)))
    return rc, json.loads(capsys.readouterr().out)


def _assert_fits(rows, shape, targets):
    assert [(r["kernel"], r["shape"], r["target"]) for r in rows] == [
        (k, shape, f"sm_{cc}") for cc in targets for k in KERNELS]
    for r in rows:
        assert r["ok"], r
        cc = int(r["target"].removeprefix("sm_"))
        assert 0 < r["registers"] <= 255 and 0 <= r["shared_bytes"] <= SHARED_LIMIT[cc], r
        assert r["spill_bytes"] == 0 and r["seconds"] > 0, r


def test_every_kernel_compiles_for_sm90_at_v4_mini(capsys):
    rc, out = _cli(capsys, "--compile", "sm_90", "--shapes", "v4-mini", "--dtypes", "fp32",
                   "--json")
    assert rc == 0 and out["ok"] is True
    _assert_fits(out["compiled"], "v4-mini", [90])


def test_v4_mini_shape_is_what_the_model_launches():
    """Heads, dims, ratios from V4Mini's config; rows per block from its CacheManager."""
    s = check_kernels.v4_mini_shape()
    assert (s.n_heads, s.head_dim, s.idx_heads, s.idx_dim, s.window) == (4, 16, 2, 8, 10)
    assert (s.csa_ratio, s.hca_ratio, s.top_k, s.swa_rows, s.comp_rows) == (4, 8, 4, 10, 4)


def test_a_compiler_rejection_names_kernel_shape_and_target():
    """Head dim 24 (not a power of two: the launch wrapper refuses it, the compiler too)."""
    bad = DEEPSEEK_V4._replace(name="odd", head_dim=24, max_pos=63)
    (row,) = compile_in_subprocess([bad], [80], ["attention_swa"])
    assert (row["kernel"], row["shape"], row["target"], row["ok"]) == (
        "attention_swa", "odd", "sm_80", False)
    assert "power of 2" in row["error"], row


def test_timeout_fails_the_row_being_compiled_and_the_rest():
    rows = compile_in_subprocess([DEEPSEEK_V4], [90], ["attention_swa", "index_topk"],
                                 timeout=0.5)
    assert [r["ok"] for r in rows] == [False, False]
    assert "still compiling" in rows[0]["error"] and "earlier row" in rows[1]["error"]


def test_named_errors_here():
    """Interpreter on in this process: refused by name, not compiled wrongly."""
    with pytest.raises(AotUnavailable, match="interpreter"):
        compile_launch(example_launch("attention_swa", DEEPSEEK_V4), 90)
    with pytest.raises(ValueError, match="sm_75"):
        parse_targets("sm_90,sm_75")
    assert parse_targets("sm_80, sm_90") == [80, 90]


def test_cli_refuses_an_unknown_shape(capsys):
    rc, out = _cli(capsys, "--compile", "sm_90", "--shapes", "v5", "--json")
    assert rc == 2 and out["ok"] is False and out["compiled"] == [] and "v5" in out["error"]


@pytest.mark.slow
def test_every_kernel_compiles_at_deepseek_v4_shapes(capsys):
    rc, out = _cli(capsys, "--compile", "sm_80,sm_90", "--shapes", "deepseek-v4", "--dtypes",
                   "fp32", "--json")
    _assert_fits(out["compiled"], "deepseek-v4", [80, 90])
    assert rc == 0


@pytest.mark.slow
def test_every_kernel_compiles_for_sm80_at_v4_mini(capsys):
    rc, out = _cli(capsys, "--compile", "sm_80", "--shapes", "v4-mini", "--dtypes", "fp32",
                   "--json")
    _assert_fits(out["compiled"], "v4-mini", [80])
    assert rc == 0
