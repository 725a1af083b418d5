"""`hybridkv check-kernels --json`: one JSON object on stdout, exit status follows the checks."""
import argparse
import json

import kernels.selfcheck as selfcheck
from hybridkv.commands import check_kernels


def _run(capsys, *argv):
    p = argparse.ArgumentParser()
    check_kernels.add_arguments(p)
    rc = check_kernels.run(p.parse_args(list(argv)))
    return rc, json.loads(capsys.readouterr().out)


def test_json_shape_and_success(capsys):
    rc, out = _run(capsys, "--json", "--grid-backend", "torch")
    names = {k["name"] for k in out["kernels"]}
    assert rc == 0 and out["ok"] is True
    assert {"attention_swa", "attention_sparse", "attention_hca", "compressor_csa",
            "compressor_hca", "indexer_topk"} <= names
    assert all(0 <= k["max_abs_err"] <= k["tol"] for k in out["kernels"])
    assert out["resume_grid"]["mismatches"] == 0 and 96 in out["resume_grid"]["lengths"]


def test_failing_kernel_gives_nonzero_exit(capsys, monkeypatch):
    real = selfcheck.default_cases

    def broken(seed=0):
        cases = real(seed)
        return cases + [(lambda c: selfcheck.Err("attention_swa", 0.5, selfcheck.ATOL), None)]

    monkeypatch.setattr(selfcheck, "default_cases", broken)
    rc, out = _run(capsys, "--json", "--grid-backend", "torch")
    assert rc == 1 and out["ok"] is False
    assert [k["max_abs_err"] for k in out["kernels"] if k["name"] == "attention_swa"] == [0.5]
