"""UnsealedChain: a request's chain blocks of one pool that it wrote and has not sealed yet.

Chain blocks are written in order of their ends (a prefill writes hundreds at once) and sealed
from the front as commits reach their ends, so the queue is three columns (block ids, end
positions, versions at writing) and a commit takes a prefix of them as lists: no ``Owned`` per
block and no pop per block.  An ``Owned`` is made only where one object is handed on (a copy
kept private, free, checked mode's count of working objects).
"""
from bisect import bisect_right

from hybridkv.cache.request import Owned


class UnsealedChain:
    __slots__ = ("refs", "blocks", "ats", "vers")

    def __init__(self, refs):
        self.refs = refs                 # the pool's block -> ObjRef list (Pool.refs)
        self.blocks, self.ats, self.vers = [], [], []

    def __len__(self):
        return len(self.blocks)

    def __iter__(self):
        """Each block as its Owned, in order."""
        refs = self.refs
        return (Owned(refs[b], at, ver) for b, at, ver in zip(self.blocks, self.ats, self.vers))

    def first_at(self):
        """The end of the first unsealed block (the queue is not empty)."""
        return self.ats[0]

    def append(self, o):
        """Chain block ``o`` (an Owned of this pool, ending past every block here)."""
        self.extend([o.ref.block], [o.at], [o.ver])

    def extend(self, blocks, ats, vers):
        """Chain blocks ``blocks`` ending at ``ats`` (ascending, past every block here),
        written at versions ``vers``."""
        if ats and self.ats and ats[0] <= self.ats[-1]:
            raise ValueError(f"chain block ends must ascend: {ats[0]} after {self.ats[-1]}")
        self.blocks += blocks
        self.ats += ats
        self.vers += vers

    def take_upto(self, end):
        """The blocks ending at or before ``end`` leave the queue: (blocks, ends, versions)."""
        k = len(self.ats) if self.ats and self.ats[-1] <= end else bisect_right(self.ats, end)
        out = self.blocks[:k], self.ats[:k], self.vers[:k]
        del self.blocks[:k], self.ats[:k], self.vers[:k]
        return out
