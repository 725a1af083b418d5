"""ValuePolicy's compact entries kept as columns over a key space (``key_space``, what the
evictor sets for a pool: its block ids): the same answers as the dict, refusals by name."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybridkv.policy import EntryMeta, FilteredLRUPolicy, LRUPolicy, PolicyError, ValuePolicy
from hybridkv.policy_entries import CompactEntries, DenseCompactEntries


def _state(p):
    return (p.clock, len(p), {k: (e.meta, e.prio, e.uses, e.seq) for k, e in p.entries().items()},
            dict(p._entered), repr(p._seq))


@pytest.mark.parametrize("cls", [ValuePolicy, LRUPolicy, FilteredLRUPolicy])
def test_a_numpy_flops_column_admits_what_a_list_admits(cls):
    """The evictor hands a long chain's FLOPs as a numpy column: entries, priorities and
    metas as from the list, in a dense store and in the dict."""
    keys = list(range(5, 69))
    flops = [float(61 * 16 * (i + 1)) for i in range(len(keys))]
    for dense in (False, True):
        by_list, by_array = cls(), cls()
        if dense:
            by_list.key_space(100)
            by_array.key_space(100)
        by_list.admit_chain(keys, "block", 4096, flops, "comp", 1.0)
        by_array.admit_chain(keys, "block", 4096, np.asarray(flops), "comp", 1.0)
        assert _state(by_list) == _state(by_array)
        assert all(type(e.meta.flops) is float for e in by_array.entries().values())


def test_dense_store_refuses_keys_outside_the_space_and_duplicates_whole():
    p = FilteredLRUPolicy()
    p.key_space(10)
    p.admit_chain([1, 2, 3], "block", 64, [1.0, 2.0, 3.0], "t", 0.0)
    before = _state(p)
    for bad, value in (([4, 10], 10), ([4, -1], -1), ([4, "x"], "x"), ([4, 2.5], 2.5),
                       ([4, 3.0], 3.0), ([4, 5, 4], 4), ([6, 2], 2)):
        with pytest.raises(PolicyError) as err:
            p.admit_chain(bad, "block", 64, [1.0] * len(bad), "t", 0.0)
        assert err.value.value == value
        assert _state(p) == before
    for key in (10, -3, "a", 2.0):
        with pytest.raises(PolicyError):
            p.admit(EntryMeta(key, "block", 64, 1.0, "t"))
        assert _state(p) == before
    with pytest.raises(PolicyError):
        p.key_space(20)                       # only before the first entry
    with pytest.raises(PolicyError):
        ValuePolicy().key_space(-1)


def test_a_removed_key_can_be_admitted_again_in_a_dense_store():
    """Membership follows every way an entry leaves: remove (compact or live), remove_run."""
    p = LRUPolicy()
    p.key_space(8)
    p.admit_chain([0, 1, 2, 3], "block", 64, [1.0] * 4, "t", 0.0)
    p.eligible(0)                              # live now
    p.remove(0)
    p.remove(1, evicted=False)
    p.eligible(3)
    p.remove_run([3, 2])
    assert len(p) == 0 and p.victim() is None
    p.admit_chain([0, 1, 2, 3], "block", 64, [1.0] * 4, "t", 0.0)
    p.admit(EntryMeta(4, "block", 64, 1.0, "t"))
    assert sorted(p.entries()) == [0, 1, 2, 3, 4]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "pop", "remove"]),
                          st.lists(st.integers(0, 39), max_size=24, unique=True)), max_size=25))
def test_dense_store_answers_as_the_dict_store(ops):
    """DenseCompactEntries against CompactEntries (the dict) on random runs of puts, pops and
    removals: the same entries, counts, priorities and answers; runs both shorter and longer
    than SHORT_RUN (a short one is taken key by key)."""
    d, a = CompactEntries(), DenseCompactEntries(40)
    live = {}
    prio = 0.0
    for op, keys in ops:
        if op == "put":
            fresh = [k for k in keys if k not in d]
            runs = d.fresh_run(fresh, live), a.fresh_run(fresh, live)
            assert all(r is not None for r in runs) and list(runs[1]) == fresh
            if keys != fresh:
                assert d.fresh_run(keys, live) is a.fresh_run(keys, live) is None
            prios = [prio + i for i in range(len(fresh))]
            prio += 100.0
            for s, run in zip((d, a), runs):
                s.put_run(run, np.asarray(prios), [p * 2 for p in prios], ("block", 64, "t"))
        elif op == "pop":
            for k in keys:
                assert d.pop(k, None) == a.pop(k, None)
                a.left((k,))
        else:
            there = [k for k in keys if k in d]
            assert d.count_in(keys) == a.count_in(keys) == len(there)
            assert d.pop_max_prio(there, -1.0) == a.pop_max_prio(there, -1.0)
            a.left(there)
        assert len(d) == len(a)
        assert dict(d.items()) == dict(a.items())
        assert all(d.prio(k) == a.prio(k) for k in d)
        for k in (k for k in range(-1, 41) if k not in d):
            for store in (d, a):
                with pytest.raises(KeyError):
                    store.prio(k)
