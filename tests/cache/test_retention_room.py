"""Retention is best effort: an allocation that fits without its snapshots is never refused for
them.  It writes every retention point that fits beside it, in ``Snapshots.priority`` order
(points kept beyond the request, then the provisional end, then ``every`` points latest first),
counts the rest in ``stats()["snapshots_skipped"]``, and a refusal of the allocation itself
still changes nothing."""
import pytest

from hybridkv.cache import CacheManager
from hybridkv.cache.snapshots import Snapshots
from hybridkv.errors import AdmissionRefused, InvariantViolation
from tests.cache.helpers import LAY, P40, commit_all, fingerprint

Q = [(11 * i + 5) % 250 for i in range(80)]


def _busy(every_n=0, checked=True, **kw):
    """A cache where request A holds a 40-token prompt, then C looks up Q[:60]."""
    m = CacheManager(LAY, checked=checked, every_n=every_n, **kw)
    m.lookup("A", P40)
    commit_all(m, "A", m.allocate("A", 40))
    m.lookup("C", Q[:60])
    return m


@pytest.mark.parametrize("room", [dict(num_pages=64), dict(num_blocks=11)])
def test_an_allocation_short_of_room_for_its_snapshots_keeps_the_ones_that_fit(room):
    roomy = _busy(num_pages=512, checked=False)   # every point fits: what C would keep
    everything = roomy.snapshots.points(roomy.requests["C"], 0, 60)
    assert set(roomy.allocate("C", 60).checkpoints) == set(everything)
    m = _busy(**room)
    a = m.allocate("C", 60)                       # was AdmissionRefused for its snapshots
    assert set(a.checkpoints) < set(everything)
    assert m.stats()["snapshots_skipped"] == len(everything) - len(a.checkpoints)
    best = sorted(everything, key=lambda P: Snapshots.priority(P, everything[P]))
    assert list(a.checkpoints) == sorted(best[:len(a.checkpoints)])
    m.check_invariants()
    commit_all(m, "C", a)
    m.free("C")
    m.free("A")
    m.check_invariants()
    for P in a.checkpoints:                      # what was kept is a resume point
        assert m.lookup("D", Q[:P] + [249]).reuse_tokens == P
        m.free("D")


def test_dense_points_short_of_room_keep_the_latest():
    m = _busy(every_n=8, num_pages=72)
    everything = m.snapshots.points(m.requests["C"], 0, 60)
    a = m.allocate("C", 60)
    kept = set(a.checkpoints)
    assert 0 < len(kept) < len(everything), (kept, everything)
    dense = [P for P in everything if everything[P] == {"every"}]
    dropped = [P for P in dense if P not in kept]
    assert dropped and all(P < Q_ for P in dropped for Q_ in dense if Q_ in kept)
    m.check_invariants()


def _refused_changes_nothing(m, rid, tokens, n):
    """``rid`` looks ``tokens`` up and its allocation of n is refused: the whole state and the
    retention counters are as before."""
    m.lookup(rid, tokens)
    counters = ("snapshots_skipped", "snapshots_abandoned")
    before = fingerprint(m), [m.stats()[k] for k in counters]
    with pytest.raises(AdmissionRefused):
        m.allocate(rid, n)
    assert (fingerprint(m), [m.stats()[k] for k in counters]) == before


def test_the_allocation_itself_short_is_refused_and_changes_nothing():
    m = _busy(num_pages=64)
    m.free("C")
    _refused_changes_nothing(m, "C", Q, 100)


def test_priority_order():
    key = Snapshots.priority
    assert key(16, {"every"}) > key(40, {"every"}) > key(8, {"end"}) > key(2, {"branch"})
    assert key(40, {"end", "every"}) < key(44, {"every"})
    assert key(40, {"repeat", "end"}) == key(40, {"boundary"})


R = [(13 * i + 7) % 250 for i in range(80)]


def _pending(pages):
    """C allocated 60 positions with dense points (every 8) written, none captured yet."""
    m = CacheManager(LAY, checked=True, num_pages=pages, every_n=8)
    m.lookup("C", Q[:60])
    a = m.allocate("C", 60)
    m.lookup("D", R[:40])
    return m, a


def test_an_allocation_short_of_room_abandons_pending_snapshots_least_worth_first():
    m, a = _pending(70)
    assert a.checkpoints == (40, 48, 56, 58, 60)
    d = m.allocate("D", 40)                       # refused before: C's snapshots held the room
    assert m.stats()["snapshots_abandoned"] == 3
    assert m.requests["C"].pending_points == [58, 60]    # repeat and end kept, every 40-56 gone
    m.check_invariants()
    commit_all(m, "C", a)                         # C's commits pass the abandoned points
    commit_all(m, "D", d)
    for rid in ("C", "D"):
        m.free(rid)
    m.check_invariants()
    assert m.lookup("E", Q[:58] + [249]).reuse_tokens == 58
    m.free("E")
    assert m.lookup("F", Q[:56] + [249]).reuse_tokens < 56     # 56 was abandoned


def test_abandoning_every_pending_snapshot_would_not_do_so_nothing_changes():
    m, a = _pending(40)
    m.free("D")
    _refused_changes_nothing(m, "D", R, 80)
    assert m.requests["C"].pending_points == list(a.checkpoints)


def test_an_abandoned_point_waiting_for_its_tokens_is_never_published():
    """C's points past its prompt wait for the decoded tokens to be published; abandoned,
    their blocks go to D, written at the same version: C's later commits must not publish
    D's blocks under C's keys."""
    for pages in range(44, 80, 2):
        m = CacheManager(LAY, checked=True, num_pages=pages, every_n=8, check_every=1)
        m.lookup("C", Q[:40])
        m.allocate("C", 60)
        m.lookup("D", R[:40])
        try:
            d = m.allocate("D", 40)
        except AdmissionRefused:
            continue
        if m.stats()["snapshots_abandoned"]:     # C's points past 40 wait for tokens
            break
    else:
        pytest.fail("no size abandons a point waiting for its tokens")
    m.commit("C", 40)                             # while D's blocks are still WRITING
    for t in range(20):
        m.commit("C", 1, [t])
        m.check_invariants()
    commit_all(m, "D", d)
    m.free("C")
    m.free("D")
    m.check_invariants()


def test_written_snapshots_count_as_room_until_a_commit_resolves_them():
    """What an allocation could take now includes what written, uncaptured snapshots hold
    (an allocation short of room takes it): vLLM's free block count stays put when they are
    captured and become evictable."""
    m, a = _pending(70)
    room = m.snapshots.reclaimable
    pages = sum(m.pools[(o.ref.kind, o.ref.group)].pages_held_by(o.ref.block)
                for P in a.checkpoints for o in m.requests["C"].snapshots[P])
    assert sum(room.values()) == pages > 0
    assert m.snapshots.reclaimable_objects == sum(
        len(m.requests["C"].snapshots[P]) for P in a.checkpoints)
    free_or_evictable = m.arena.available(m.pools, m.evictor)
    assert set(m.available_blocks().values()) == {free_or_evictable + pages}
    commit_all(m, "C", a)
    assert not any(m.snapshots.reclaimable.values()) and not m.snapshots.reclaimable_objects
    assert not m.snapshots.written
    m.check_invariants()


def test_a_reclaimable_count_that_drifts_is_caught():
    m, _ = _pending(70)
    m.check_invariants()
    m.snapshots.reclaimable_objects += 1
    with pytest.raises(InvariantViolation):
        m.check_invariants()
