"""`hybridkv bench allocator` runs end to end: one JSON object with the three modes and their
ratios."""
import json
import os
import subprocess
import sys


from hybridkv.bench.vllm_streams import REPO_ROOT
from hybridkv.commands import bench


def test_bench_allocator_json():
    """No --trace: the shipped mooncake-conversation trace."""
    out = subprocess.run([sys.executable, "-m", "hybridkv.commands.bench", "allocator",
                          "--limit", "6", "--checked-limit", "2", "--num-blocks", "256",
                          "--repeat", "1", "--json"],
                         capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
                         env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    for k in ("checked_off", "checked_on", "guards_stubbed"):
        assert obj[k]["ops_per_s"] > 0 and obj[k]["ops"] == 3 * obj[k]["requests"]
        assert obj[k]["refused"] == 0
    assert obj["checked_on"]["requests"] == 2 and obj["checked_off"]["requests"] == 6
    assert obj["checked_off"]["hit_token_rate"] > 0
    assert obj["guard_overhead_ratio"] > 0 and obj["same_hits_with_stubs"]


def test_bench_bad_trace_path(tmp_path, capsys):
    code = bench.main(["allocator", "--trace", str(tmp_path / "x"), "--json"])
    assert code == 2 and capsys.readouterr().out == ""
    code = bench.main(["vs-vllm", "--trace", str(tmp_path / "x"), "--json"])
    assert code == 2 and capsys.readouterr().out == ""
