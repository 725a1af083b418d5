"""The fault matrix as tests: every fault ends with 0 wrong outputs, 0 crashes, 0 unnamed
exceptions, 0 hangs, 0 intact entries lost, and the tier doing what the issue specifies
(miss / refusal / cancel / sweep)."""
import threading
import time
import json
import os
import subprocess
import sys

import pytest
import torch

from hybridkv.disk import BadInput
from hybridkv.testing.faults import files, kit, proc, tier
from hybridkv.disk.loader import LoadResult, LoadStatus
from tests.disk.redis_server import require_redis_server

SCENARIOS = files.LOCAL + tier.TIER + [proc.crash_before_rename, proc.two_process_race,
                                       proc.version_skew]
COUNTS = ("wrong_outputs", "crashes", "unnamed_exceptions", "hangs", "intact_lost")


def clean(row):
    return all(getattr(row, f) == 0 for f in COUNTS) and row.expected and not row.bad


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_fault_row(tmp_path, scenario):
    row = scenario(str(tmp_path))
    assert clean(row) and row.trials > 0, row


def test_hung_backend_row_measures_latency_under_the_goal(tmp_path):
    row = tier.hung_backend(str(tmp_path), rounds=5)
    assert clean(row) and 0 < row.max_latency_ms < 50, row


def test_redis_connection_lost_mid_load(tmp_path):
    require_redis_server()
    row = proc.redis_conn_lost(str(tmp_path))
    assert clean(row), row
    assert "server killed: io:" in row.outcome


def test_full_redis_row(tmp_path):
    require_redis_server()
    row = tier.redis_full(str(tmp_path))
    assert clean(row) and row.trials >= 9, row


def test_counter_counts_hangs_and_unnamed_exceptions_without_waiting():
    c, ev = kit.Counter(deadline=0.2), threading.Event()
    t0 = time.monotonic()
    assert c.call(ev.wait, 30) is None and time.monotonic() - t0 < 5
    c.call(lambda: {}["missing"])                      # KeyError: unnamed

    def named():
        raise BadInput("x", 1)
    c.call(named)
    ev.set()
    assert (c.hangs, c.crashes, c.unnamed) == (1, 2, 1)
    row = c.row("r", "o", True)
    assert row.bad and row.as_json()["hangs"] == 1


class _LyingTier:
    """Claims VERIFIED but writes the wrong bytes: the counter must notice."""

    def __init__(self, fill, status=LoadStatus.VERIFIED):
        self.fill, self.status = fill, status

    def load(self, key, dest, meta, timeout=None):
        dest.fill_(self.fill)
        return LoadResult(key, self.status, "lie")


def test_counter_detects_wrong_outputs_and_crashes():
    c, orig = kit.Counter(), torch.ones(4)
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
    assert len(out["faults"]) == 18 and out["load_bandwidth_ratio"] > 0
    for row in out["faults"]:
        assert set(row) == {"name", "outcome", "trials", "max_latency_ms", *COUNTS}
        assert all(row[f] == 0 for f in COUNTS), row
        assert not row["outcome"].startswith("UNEXPECTED"), row
    hung = next(r for r in out["faults"] if r["name"].startswith("hung backend"))
    assert 0 < hung["max_latency_ms"] < 50
