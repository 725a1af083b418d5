"""CacheManager.pending_checkpoints: the retention points an allocation wrote that no commit
has reached yet -- an engine that computes past several in one step commits up to each."""
from tests.cache.helpers import P40, mk


def test_a_commit_ending_on_each_pending_point_captures_it():
    m = mk(every_n=16)
    m.lookup("a", P40)
    m.allocate("a", 40)
    assert m.pending_checkpoints("a") == (16, 32, 38, 40)    # every 16, repeat, end
    done = 0
    for stop in m.pending_checkpoints("a"):                  # what the vLLM adapter does
        m.commit("a", stop - done, P40[done:stop])
        done = stop
    assert m.pending_checkpoints("a") == ()
    m.free("a")
    assert m.lookup("b", P40[:33] + [7]).reuse_tokens == 32


def test_one_commit_past_the_points_gives_them_up():
    m = mk(every_n=16)
    m.lookup("a", P40)
    m.allocate("a", 40)
    m.commit("a", 40, P40)                                   # passes 16, 32, 38
    assert m.pending_checkpoints("a") == ()
    m.free("a")
    assert m.lookup("b", P40[:33] + [7]).reuse_tokens == 0
