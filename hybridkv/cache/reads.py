"""A request's reads -- the shared blocks it pins and reads in place -- kept pool by pool as
columns of ints.

A request pins every chain block its hit names and every block it seals; a long prompt's are
hundreds, held until the request is freed.  As one ``Read`` record each they were as many
tracked objects outliving the young generations, and the garbage collector's older
collections come as often as such objects pile up.  As columns per
pool they are five lists, and the paths that use them take a pool's run whole: the pin and
the launch check compare versions as lists, a free unpins and admits a pool's run tips first.
Iterating yields ``Read`` records (made then, short-lived) for the paths that want one
(checked mode, tests, a caller's ``read_ok``).
"""
from itertools import groupby

from hybridkv.cache.funnel import (READ_AT, READ_BLOCK, READ_EP, READ_EXACT, READ_POOL,
                                   READ_VER, new_read)
from hybridkv.cache.pool import ObjRef


class PoolReads:
    """One pool's reads, in the order taken: the block ids, the position each must cover, the
    version and relocation epoch each had when pinned, and whether it is an exact object (a
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

    def __iter__(self):
        kind, group = self.kind, self.group
        refs = [ObjRef(kind, group, b) for b in self.blocks]
        return map(new_read, zip(refs, self.at, self.ver, self.ep, self.exact))

    def __len__(self):
        return len(self.blocks)


class Reads:
    """Pool key -> PoolReads, pools in the order first read; ``reads`` (Read records) seed
    it, as a hit's plan does."""
    __slots__ = ("pools",)

    def __init__(self, reads=()):
        self.pools = {}
        for (kind, group), run in groupby(reads, READ_POOL):     # a plan's reads come in
            run = list(run)                                       # runs of one pool
            self.add(kind, group, list(map(READ_BLOCK, run)), list(map(READ_AT, run)),
                     list(map(READ_VER, run)), list(map(READ_EP, run)),
                     list(map(READ_EXACT, run)))

    def add(self, kind, group, blocks, at, vers, eps, exact=None):
        """Append one pool's run (``exact`` None: chain blocks, none exact)."""
        pool = self.pools.get((kind, group))
        if pool is None:
            pool = self.pools[(kind, group)] = PoolReads(kind, group)
        pool.add(blocks, at, vers, eps, [False] * len(blocks) if exact is None else exact)

    def runs(self):
        """(pool key, PoolReads) per pool read."""
        return self.pools.items()

    def __iter__(self):
        for pool in self.pools.values():
            yield from pool

    def __len__(self):
        return sum(map(len, self.pools.values()))

    def __bool__(self):
        return any(self.pools.values())
