"""``Snapshots.points`` against a per-position oracle: every P in (start, end] is a retention
point exactly when one of its rules names it (the branch, the fork, the commit's end, the
prompt's last granule, its last resume boundary, every n-th position), on the granule and not
past the last position a point may take (an objectless layout: the prompt's last token).  Its
early return (no position can qualify: an objectless layout's decode step) must agree."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import CacheManager
from hybridkv.layout import ModelLayout
from tests.cache.helpers import LAY, P40

FULL = ModelLayout.full(block_size=8)


def _oracle(snaps, req, start, end):
    gran, plan, n = snaps.layout.granule, req.plan, req.prompt_len
    last = n - 1 if snaps.objectless else end
    out = {}
    for P in range(start + 1, end + 1):
        if P > last or P % gran:
            continue
        tags = {tag for tag, named in (
            ("branch", P == plan.branch < n),
            ("fork", P == req.shared_tokens and
             max(plan.branch, snaps.min_fork - 1) < req.shared_tokens < n),
            ("end", P == end - end % snaps.resume_every),
            ("repeat", P == (n - 1) // gran * gran),
            ("boundary", snaps.resume_every > gran and
             P == (n - 1) // snaps.resume_every * snaps.resume_every),
            ("every", bool(snaps.every_n) and P % snaps.every_n == 0)) if named}
        if tags:
            out[P] = tags
    return out


def _looked_up(layout, every_n, shared):
    m = CacheManager(layout, num_blocks=64, every_n=every_n, checked=False)
    m.lookup("A", P40)
    a = m.allocate("A", 40)
    m.commit("A", a.end - a.start)
    m.free("A")
    m.lookup("B", P40[:shared] + [249] * (40 - shared))
    return m, m.requests["B"]


@settings(max_examples=150, deadline=None)
@given(objectless=st.booleans(), every_n=st.sampled_from([0, 8, 16]),
       shared=st.integers(0, 40), start=st.integers(0, 60), n=st.integers(1, 40))
def test_points_are_exactly_the_positions_a_rule_names(objectless, every_n, shared, start, n):
    m, req = _looked_up(FULL if objectless else LAY, every_n, shared)
    assert m.snapshots.objectless == objectless
    got = m.snapshots.points(req, start, start + n)
    assert got == _oracle(m.snapshots, req, start, start + n)
    assert list(got) == sorted(got)


def test_an_objectless_decode_step_past_the_prompt_has_no_point():
    m, req = _looked_up(FULL, 8, 40)
    assert m.snapshots.points(req, 39, 40) == {}              # the prompt's end: no P <= 39
    assert m.snapshots.points(req, 0, 40) != {}               # its prefill names some
