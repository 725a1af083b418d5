"""UnsealedChain answers as the deque of Owned it replaced (append, extend, pop from the front
while the first block ends at or before a commit's end, iterate, count)."""
import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache.pool import ObjRef
from hybridkv.cache.request import Owned
from hybridkv.cache.unsealed import UnsealedChain

REFS = [ObjRef("comp", "g0", b) for b in range(64)]


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("extend"), st.integers(0, 5)),
    st.tuples(st.just("append"), st.just(1)),
    st.tuples(st.just("take"), st.integers(0, 40))), max_size=30))
def test_the_columns_answer_as_a_deque_of_owned_blocks(ops):
    chain, model, end, next_block = UnsealedChain(REFS), collections.deque(), 0, 0
    for op, n in ops:
        if op == "take":
            limit = n * 4
            done = []
            while model and model[0].at <= limit:
                done.append(model.popleft())
            if chain and chain.first_at() <= limit:
                got = chain.take_upto(limit)
            else:
                got = ([], [], [])
            assert got == ([o.ref.block for o in done], [o.at for o in done],
                           [o.ver for o in done])
        else:
            objs = []
            for _ in range(n):
                end += 4
                objs.append(Owned(REFS[next_block % 64], end, next_block % 3))
                next_block += 1
            model.extend(objs)
            if op == "append":
                for o in objs:
                    chain.append(o)
            else:
                chain.extend([o.ref.block for o in objs], [o.at for o in objs],
                             [o.ver for o in objs])
        assert len(chain) == len(model) and bool(chain) == bool(model)
        assert list(chain) == list(model)
        assert all(type(o) is Owned for o in chain)
        if model:
            assert chain.first_at() == model[0].at


def test_a_block_ending_before_the_last_is_refused_and_changes_nothing():
    chain = UnsealedChain(REFS)
    chain.extend([1, 2], [16, 32], [0, 0])
    with pytest.raises(ValueError):
        chain.extend([3], [32], [0])
    with pytest.raises(ValueError):
        chain.append(Owned(REFS[4], 8, 0))
    assert (chain.blocks, chain.ats, chain.vers) == ([1, 2], [16, 32], [0, 0])
