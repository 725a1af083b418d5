"""The manager-level rows of the fault matrix (issue 15): every count ends at 0."""
import pytest

from hybridkv.testing.faults import manager as F


@pytest.mark.parametrize("row", F.ROWS, ids=[f.__name__ for f in F.ROWS])
def test_manager_fault_row(row, tmp_path):
    r = row(str(tmp_path))
    if r.outcome.startswith("skipped"):
        pytest.skip(r.outcome)
    assert not r.bad, r.as_json()
    assert r.trials > 0
