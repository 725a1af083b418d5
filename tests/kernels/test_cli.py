"""`hybridkv check-kernels --json`: one JSON object on stdout, exit status follows the checks
(kernels vs references, the resume grid through the CacheManager, greedy cold vs resumed)."""
import argparse
import json

import kernels.selfcheck as selfcheck
from hybridkv.commands import check_kernels
from hybridkv.model import resume
from hybridkv.model.resume import SUBSET, aligned


def _run(capsys, *argv):
    p = argparse.ArgumentParser()
    check_kernels.add_arguments(p)
    rc = check_kernels.run(p.parse_args(list(argv)))
    return rc, json.loads(capsys.readouterr().out)


def test_json_shape_and_success(capsys):
    rc, out = _run(capsys, "--json", "--grid-backend", "torch", "--grid", "subset")
    names = {k["name"] for k in out["kernels"]}
    assert rc == 0 and out["ok"] is True
    assert {"attention_swa", "attention_sparse", "attention_hca", "compressor_csa",
            "compressor_hca", "compress_batch_csa", "compress_batch_hca",
            "indexer_topk"} <= names
    assert all(0 <= k["max_abs_err"] <= k["tol"] for k in out["kernels"])
    g = out["resume_grid"]["backends"]["torch"]
    assert out["resume_grid"]["mismatches"] == 0 and g["mismatches"] == 0
    assert g["lengths"] == list(SUBSET)
    assert g["aligned"] == g["resumed_at"] == [aligned(H, 2) for H in SUBSET]
    assert g["greedy"]["ok"] and out["resume_grid"]["grid_seconds"]["torch"] > 0


def test_failing_kernel_gives_nonzero_exit(capsys, monkeypatch):
    real = selfcheck.default_cases

    def broken(seed=0):
        cases = real(seed)
        return cases + [(lambda c: selfcheck.Err("attention_swa", 0.5, selfcheck.ATOL), None)]

    monkeypatch.setattr(selfcheck, "default_cases", broken)
    monkeypatch.setattr(resume, "SUBSET", (4,))
    rc, out = _run(capsys, "--json", "--grid-backend", "torch", "--grid", "subset")
    assert rc == 1 and out["ok"] is False
    assert [k["max_abs_err"] for k in out["kernels"] if k["name"] == "attention_swa"] == [0.5]


def test_grid_mismatch_gives_nonzero_exit(capsys, monkeypatch):
    """A snapshot overwritten between capture and resume fails the command."""
    real = resume.check_grid

    def tampered(model, lengths, **kw):
        return real(model, lengths, tamper=lambda c, p: resume.overwrite_snapshot(
            c, p, "tail", "csa"), **kw)

    monkeypatch.setattr(resume, "check_grid", tampered)
    monkeypatch.setattr(resume, "SUBSET", (10, 11))
    rc, out = _run(capsys, "--json", "--grid-backend", "torch", "--grid", "subset")
    g = out["resume_grid"]["backends"]["torch"]
    assert rc == 1 and out["ok"] is False and g["mismatches"] == 2
    assert [(c["H"], c["aligned"], c["reuse"]) for c in g["bad"]] == [(10, 10, 10), (11, 10, 10)]
