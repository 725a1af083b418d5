"""``CacheManager.detach``: an engine done with a request whose in-flight step may still write
its blocks keeps everything the request holds under a handle (nothing free, nothing evictable)
while the request id is reused at once; ``free(handle)`` releases it as ``free`` would."""
import pytest

from hybridkv.errors import UnknownRequest
from tests.cache.helpers import P40, commit_all, fingerprint, mk


def held(m):
    return {pk: (p.n_free, m.evictor.available(pk)) for pk, p in m.pools.items()}


def test_a_detached_request_holds_everything_until_its_handle_is_freed():
    m = mk()
    start = held(m)
    plan = m.lookup("a", P40)
    commit_all(m, "a", m.allocate("a", len(P40) - plan.reuse_tokens))
    running = held(m)
    handle = m.detach("a")
    assert held(m) == running                  # nothing came back, nothing became evictable
    m.check_invariants()
    again = m.lookup("a", P40 + [9])           # the id is free for a new request
    assert again.reuse_tokens > 0              # it hits what the detached one published
    m.free("a")
    m.free(handle)
    assert held(m) != running
    m.check_invariants()
    assert sum(n for n, _ in held(m).values()) <= sum(n for n, _ in start.values())
    assert all(avail == start[pk][1] for pk, (_, avail) in held(m).items())


def test_detach_and_free_of_the_handle_equal_a_plain_free():
    a, b = mk(), mk()
    for m in (a, b):
        m.lookup("r", P40)
        commit_all(m, "r", m.allocate("r", len(P40)))
    a.free("r")
    b.free(b.detach("r"))
    assert fingerprint(a)[:2] == fingerprint(b)[:2]


def test_an_unknown_request_is_named_and_nothing_changes():
    m = mk()
    before = fingerprint(m)
    with pytest.raises(UnknownRequest):
        m.detach("nobody")
    assert fingerprint(m) == before and m.num_detached == 0
