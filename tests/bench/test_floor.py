"""bench floor: the spec's guards and effects alone per block (one lifecycle, event by event and
as runs of columns) beside the CacheManager's cost for the same blocks, in one run."""
import json
import random

import pytest

from hybridkv.bench import floor as F
from hybridkv.cli import main


def test_each_lifecycle_runs_every_event_or_refuses_to_time_it(monkeypatch):
    assert F.spec_single(number=3) > 0
    assert F.spec_run(16, number=3) > 0
    # a lifecycle that skips the eviction leaves the block READY at version 0: the check that
    # every event ran refuses it instead of timing it
    monkeypatch.setattr(F, "LIFECYCLE", F.LIFECYCLE[:-1])
    with pytest.raises(AssertionError, match="version 1"):
        F.spec_single(number=3)
    with pytest.raises(AssertionError, match="version 1"):
        F.spec_run(16, number=3)


def test_the_runtime_side_runs_on_a_full_pool():
    m = F._filled_manager(256, random.Random(0))
    pools = m.stats()["pools"]
    assert pools["comp/full"]["free"] == 0 and pools["comp/full"]["evictable"] > 0
    assert F.runtime_decode(num_blocks=256, blocks=20) > 0
    assert F.runtime_prefill(4, num_blocks=256, requests=5) > 0


def test_cli_prints_the_ratios(capsys):
    assert main(["bench", "floor", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    d = out["decode_block"]
    assert d["ratio"] == round(d["runtime_us"] / d["spec_us"], 2)
    assert set(out["prefill_runs"]) == {str(n) for n in F.RUN_LENGTHS}     # (JSON keys)
