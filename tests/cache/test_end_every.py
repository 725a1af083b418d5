"""``CacheManager(end_every=)``: the provisional end snapshot a decode keeps, once per
``end_every`` tokens instead of once per hash granule (the vLLM adapter sets its block size:
vLLM resumes only at whole blocks)."""
import pytest

from hybridkv.errors import BadArgument
from tests.cache.helpers import LAY, P40, mk, run

DECODED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]     # positions 40..50


def _resume_after_decode(**kw):
    m = mk(**kw)
    run(m, "a", P40, decode=DECODED)
    plan = m.lookup("b", P40 + DECODED + [5])
    m.check_invariants()
    return m, plan.reuse_tokens


def test_default_keeps_the_end_of_every_granule():
    assert LAY.granule == 2
    _, reuse = _resume_after_decode()
    assert reuse == 50                       # the last granule the decode reached


def test_end_every_keeps_the_end_once_per_stride():
    m, reuse = _resume_after_decode(end_every=8)
    assert reuse == 48                       # 48 is the last multiple of 8 the decode reached


def test_end_every_writes_fewer_snapshots():
    few, _ = _resume_after_decode(end_every=8)
    many, _ = _resume_after_decode()
    assert few.snapshots.captured_bytes < many.snapshots.captured_bytes


@pytest.mark.parametrize("bad", [0, -4, 3, 7, True, 4.0, "8"])
def test_bad_end_every_is_refused_by_name(bad):
    with pytest.raises(BadArgument) as e:
        mk(end_every=bad)
    assert str(e.value).startswith("end_every") and repr(bad) in str(e.value)
