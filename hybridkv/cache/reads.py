"""Reads -- the shared blocks a request pins and reads in place -- kept pool by pool as columns
of ints: a hit's plan names them so (``HitPlan.reads``), and a request holds them so from its
first allocation until it is freed.

A long prompt's hit names hundreds of chain blocks.  As one ``Read`` record each, a lookup
made as many tuples (an engine re-asks a waiting request every step, each time anew), the
pin converted them again, and a held request kept them as tracked objects outliving the
young generations (the garbage collector's older collections come as often as such objects
pile up).  As columns per pool they are five lists, and the paths that use them take a
pool's run whole: the pin and the launch check compare versions as lists, a free unpins and
admits a pool's run tips first, a hit's block table is one pass per pool.  Iterating yields
``Read`` records (made then, short-lived) for the paths that want one (checked mode, tests,
a caller's ``read_ok``).
"""
from functools import partial
from itertools import compress, groupby
from operator import attrgetter, not_
from typing import NamedTuple

from hybridkv.cache.pool import ObjRef


class Read(NamedTuple):
    """An object a request reads: where, the position it must cover, and the version and
    relocation epoch it had when checked (the launch re-checks them: spec can_read_pinned)."""
    ref: ObjRef
    at: int
    ver: int
    ep: int
    exact: bool = False


new_read = partial(tuple.__new__, Read)     # Read(*fields) built at C speed (no __new__ call)

READ_POOL = attrgetter("ref.kind", "ref.group")                  # a Read's pool key
READ_BLOCK, READ_VER, READ_EP = attrgetter("ref.block"), attrgetter("ver"), attrgetter("ep")
READ_AT, READ_EXACT = attrgetter("at"), attrgetter("exact")


class PoolReads:
    """One pool's reads, in the order taken: the block ids, the position each must cover, the
    version and relocation epoch each had when checked, and whether it is an exact object (a
    snapshot) rather than a chain block."""
    __slots__ = ("kind", "group", "blocks", "at", "ver", "ep", "exact")

    def __init__(self, kind, group):
        self.kind, self.group = kind, group
        self.blocks, self.at, self.ver, self.ep, self.exact = [], [], [], [], []

    def add(self, blocks, at, vers, eps, exact):
        self.blocks += blocks
        self.at += at
        self.ver += vers
        self.ep += eps
        self.exact += exact

    def append(self, read):
        """One ``Read`` of this pool."""
        self.blocks.append(read.ref.block)
        self.at.append(read.at)
        self.ver.append(read.ver)
        self.ep.append(read.ep)
        self.exact.append(read.exact)

    def chain_blocks(self):
        """The blocks that are not exact objects (a hit's chain blocks), in order."""
        if True not in self.exact:
            return self.blocks
        return list(compress(self.blocks, map(not_, self.exact)))

    def __iter__(self):
        kind, group = self.kind, self.group
        refs = [ObjRef(kind, group, b) for b in self.blocks]
        return map(new_read, zip(refs, self.at, self.ver, self.ep, self.exact))

    def __len__(self):
        return len(self.blocks)

    def __eq__(self, other):
        return isinstance(other, PoolReads) and (
            self.kind, self.group, self.blocks, self.at, self.ver, self.ep, self.exact) == (
            other.kind, other.group, other.blocks, other.at, other.ver, other.ep, other.exact)

    __hash__ = None


class Reads:
    """Pool key -> PoolReads, pools in the order first read; ``reads`` (Read records) seed
    it.  A plan's reads are read only; a request's own (``copy``) grow as it seals blocks."""
    __slots__ = ("pools",)

    def __init__(self, reads=()):
        self.pools = {}
        for (kind, group), run in groupby(reads, READ_POOL):     # runs of one pool
            run = list(run)
            self.add(kind, group, list(map(READ_BLOCK, run)), list(map(READ_AT, run)),
                     list(map(READ_VER, run)), list(map(READ_EP, run)),
                     list(map(READ_EXACT, run)))

    def add(self, kind, group, blocks, at, vers, eps, exact=None):
        """Append one pool's run (``exact`` None: chain blocks, none exact)."""
        pool = self.pools.get((kind, group))
        if pool is None:
            pool = self.pools[(kind, group)] = PoolReads(kind, group)
        pool.add(blocks, at, vers, eps, [False] * len(blocks) if exact is None else exact)

    def add_run(self, run, n=None):
        """Append the first ``n`` (all: None) of a PoolReads."""
        n = len(run) if n is None else n
        self.add(run.kind, run.group, run.blocks[:n], run.at[:n], run.ver[:n], run.ep[:n],
                 run.exact[:n])

    def copy(self):
        out = Reads()
        for run in self.pools.values():
            out.add_run(run)
        return out

    def runs(self):
        """(pool key, PoolReads) per pool read."""
        return self.pools.items()

    def exact_refs(self):
        """ObjRef of every exact object read (a hit's snapshots: a few per group)."""
        return [ObjRef(run.kind, run.group, b) for run in self.pools.values() if True in run.exact
                for b, e in zip(run.blocks, run.exact) if e]

    def __iter__(self):
        for pool in self.pools.values():
            yield from pool

    def __len__(self):
        return sum(map(len, self.pools.values()))

    def __bool__(self):
        return any(self.pools.values())

    def __eq__(self, other):
        return isinstance(other, Reads) and self.pools == other.pools

    __hash__ = None

    def __repr__(self):
        return f"Reads({list(self)!r})"


NO_READS = Reads()      # no reads (read only: never added to)
