"""The fault matrix as tests: every fault ends with 0 wrong outputs, 0 crashes, and the
tier doing what the issue specifies (miss / refusal / cancel / sweep)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from hybridkv.disk import faults, faults_proc
from hybridkv.disk.loader import LoadResult, LoadStatus
from redis_server import require_redis_server

SCENARIOS = faults.LOCAL + [faults_proc.crash_before_rename, faults_proc.two_process_race]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_fault_row(tmp_path, scenario):
    row = scenario(str(tmp_path))
    assert (row.wrong_outputs, row.crashes) == (0, 0), row
    assert row.expected, row


def test_redis_connection_lost_mid_load(tmp_path):
    require_redis_server()
    row = faults_proc.redis_conn_lost(str(tmp_path))
    assert (row.wrong_outputs, row.crashes, row.expected) == (0, 0, True), row
    assert "server killed: io:" in row.outcome


class _LyingTier:
    """Claims VERIFIED but writes the wrong bytes: the counter must notice."""

    def __init__(self, fill, status=LoadStatus.VERIFIED):
        self.fill, self.status = fill, status

    def load(self, key, dest, meta, timeout=None):
        dest.fill_(self.fill)
        return LoadResult(key, self.status, "lie")


def test_counter_detects_wrong_outputs_and_crashes():
    c, orig = faults.Counter(), torch.ones(4)
    c.load(_LyingTier(2.0), "k", orig)
    c.load(_LyingTier(1.0, LoadStatus.MISS), "k", orig)    # a miss that scribbled on dest
    c.load(_LyingTier(1.0), "k", orig)                    # correct
    c.call(lambda: 1 / 0)
    assert (c.wrong, c.crashes) == (2, 1)


def test_cli_prints_one_json_object_with_every_row(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "hybridkv.cli", "faults", "--json", "--dir",
                        str(tmp_path), "--bench-objects", "2", "--bench-object-mib", "1"],
                       capture_output=True, text=True, timeout=240, env=env)
    out = json.loads(p.stdout)
    assert set(out) == {"faults", "load_bandwidth_ratio"} and p.returncode == 0, p.stderr
    assert len(out["faults"]) == 10 and out["load_bandwidth_ratio"] > 0
    for row in out["faults"]:
        assert set(row) == {"name", "outcome", "wrong_outputs", "crashes"}
        assert row["wrong_outputs"] == 0 and row["crashes"] == 0, row
        assert not row["outcome"].startswith("UNEXPECTED"), row
