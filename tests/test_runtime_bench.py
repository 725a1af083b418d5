"""`hybridkv bench allocator`: one JSON object with the three modes and their ratios; the
guard stubs are restored afterwards."""
import json
import os
import subprocess
import sys

import pytest

from hybridkv.commands import bench
from hybridkv import lookup

TRACE = bench.DEFAULT_TRACE


@pytest.mark.skipif(not os.path.isfile(TRACE), reason="trace not present")
def test_bench_allocator_json():
    out = subprocess.run([sys.executable, "-m", "hybridkv.cli", "bench", "allocator", "--limit",
                          "6", "--checked-limit", "2", "--num-blocks", "256", "--repeat", "1",
                          "--json"],
                         capture_output=True, text=True, timeout=120, cwd="/work/main")
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    for k in ("checked_off", "checked_on", "guards_stubbed"):
        assert obj[k]["ops_per_s"] > 0 and obj[k]["ops"] == 3 * obj[k]["requests"]
    assert obj["checked_on"]["requests"] == 2 and obj["checked_off"]["requests"] == 6
    assert obj["guard_overhead_ratio"] > 0 and obj["same_hits_with_stubs"]


def test_stubbed_guards_are_restored():
    before = {k: list(v) for k, v in lookup.READY_CHECKS.items()}
    with bench.stubbed_guards():
        assert all(v == [] for v in lookup.READY_CHECKS.values())
    assert lookup.READY_CHECKS == before


def test_bench_bad_trace_path(tmp_path, capsys):
    class A:
        what, trace, limit, checked_limit, num_blocks, json, repeat = (
            "allocator", str(tmp_path / "x"), 5, None, 8, True, 1)
    assert bench.run(A) == 2
    assert capsys.readouterr().out == ""
