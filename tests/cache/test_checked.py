"""Checked mode checks incrementally: after every public call, every invariant on the state
the call touched (the pools track touched blocks), a full sweep every ``check_every`` calls
and in ``check_invariants()``.  A corruption the call itself makes is caught by that call."""
import pytest

from hybridkv.cache import CacheManager, ObjRef
from hybridkv.errors import InvariantViolation
from spec.common import READY
from spec.effects import EFFECTS
from tests.cache.helpers import LAY, P40, commit_all, run

NEVER = 10 ** 9          # no periodic sweep: only the incremental check runs


@pytest.mark.parametrize("field,value,name", [("draft", 1, "draft_isolation"),
                                              ("pins", 1, "pool_integrity"),
                                              ("rows", 0, "published_complete"),
                                              ("pub", 0, "accounting")])
def test_corruption_of_a_touched_object_is_caught_by_that_call(monkeypatch, field, value, name):
    """A seeded bug: sealing a tail corrupts the record.  The commit that seals is the call
    that must raise (no full sweep is due)."""
    seal = EFFECTS["seal"]

    def bad_seal(o, c):
        o = seal(o, c)
        return o._replace(**{field: value}) if hasattr(o, "rows") else o

    m = CacheManager(LAY, num_blocks=48, checked=True, check_every=NEVER)
    plan = m.lookup("a", P40)
    a = m.allocate("a", 40 - plan.reuse_tokens)
    monkeypatch.setitem(EFFECTS, "seal", bad_seal)
    with pytest.raises(InvariantViolation) as e:
        commit_all(m, "a", a)
    assert e.value.value == name


def test_a_leaked_block_is_an_accounting_violation():
    """A released snapshot that is neither dropped nor made evictable (the leak of issue 14)
    is caught: every non-free block must be held, cached (evictable) or loading."""
    m = CacheManager(LAY, num_blocks=48, checked=True, check_every=NEVER)
    run(m, "a", P40)
    ref = next(ObjRef("tail", "csa", b) for b in m.evictor.cached[("tail", "csa")])
    m.evictor.forget(ref)                   # out of the cache's books, still READY
    with pytest.raises(InvariantViolation) as e:
        m.check_invariants()
    assert e.value.value in ("accounting", "state_routing")


def test_untouched_corruption_waits_for_the_sweep():
    """A block changed behind the manager's back (no call touched it) is found by
    check_invariants() at once and by the periodic sweep within check_every calls."""
    m = CacheManager(LAY, num_blocks=48, checked=True, check_every=4)
    run(m, "a", P40)
    pool = m.pools[("tail", "csa")]
    b = next(i for i, r in enumerate(pool.recs) if r.st == READY)
    pool.recs[b] = pool.recs[b]._replace(rows=0)
    with pytest.raises(InvariantViolation):
        m.check_invariants()
    with pytest.raises(InvariantViolation) as e:
        for _ in range(4):
            m.stats()
    assert e.value.value == "published_complete"


def test_incremental_check_cost_does_not_grow_with_pool_size():
    """The same requests on pools 5x larger: the incremental check examines the same
    number of blocks (the touched ones), and still the whole state passes a full sweep."""
    seen = []
    for n in (64, 320):
        m = CacheManager(LAY, num_blocks=n, checked=True, check_every=NEVER)
        for j in range(3):
            run(m, f"r{j}", P40[:20 + 8 * j] + [j])
        seen.append(m.checker.last_checked)
        m.check_invariants()
    assert seen[0] == seen[1] > 0


def test_a_policy_entry_without_its_cached_block_is_a_routing_violation():
    """The evictor's ``admitted`` set is its policy's keys: a policy that holds an entry the
    evictor does not know (a victim it may name that no set holds) or lost one it does is
    caught by the sweep."""
    m = CacheManager(LAY, num_blocks=48, checked=True, check_every=NEVER)
    run(m, "a", P40)
    m.check_invariants()
    pk = ("comp", "csa")
    b = next(iter(m.evictor.admitted[pk]))
    m.evictor.admitted[pk].discard(b)       # the policy still holds b's entry
    with pytest.raises(InvariantViolation) as e:
        m.check_invariants()
    assert e.value.value == "state_routing" and "policy-entries" in str(e.value)
