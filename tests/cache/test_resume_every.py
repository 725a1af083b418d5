"""``CacheManager(resume_every=)``, the stride of an engine's own resume points (the vLLM
adapter sets its block size: vLLM resumes only at whole blocks): a decode keeps its
provisional end once per stride instead of once per hash granule, and the prompt's last stride
boundary before its last token is retained."""
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


def test_resume_every_keeps_the_end_once_per_stride():
    m, reuse = _resume_after_decode(resume_every=8)
    assert reuse == 48                       # 48 is the last multiple of 8 the decode reached


def test_resume_every_writes_fewer_snapshots():
    few, _ = _resume_after_decode(resume_every=8)
    many, _ = _resume_after_decode()
    assert few.snapshots.captured_bytes < many.snapshots.captured_bytes


@pytest.mark.parametrize("bad", [0, -4, 3, 7, True, 4.0, "8"])
def test_bad_resume_every_is_refused_by_name(bad):
    with pytest.raises(BadArgument) as e:
        mk(resume_every=bad)
    assert str(e.value).startswith("resume_every") and repr(bad) in str(e.value)


P45 = [(5 * i + 1) % 250 for i in range(45)]


def _resume_after_prompt(**kw):
    m = mk(**kw)
    run(m, "a", P45)
    plan = m.lookup("b", P45[:42] + [249, 248, 247])       # shares 42 tokens, then differs
    m.check_invariants()
    return plan.reuse_tokens


def test_the_prompt_s_last_stride_boundary_is_retained():
    """resume_every 8: the prompt's last multiple of 8 before its last token (40) is retained
    (``boundary``), so a prompt that shares 42 tokens resumes at 40; by default there is no
    checkpoint between the branch point and the repeat point (44), so it resumes earlier."""
    assert _resume_after_prompt(resume_every=8) == 40
    assert _resume_after_prompt() < 40
