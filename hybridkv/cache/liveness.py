"""Liveness per (kind, group) pool: which published blocks eviction cannot reach yet.

A published block is *live* when it is not cached or is *blocked* (cached with a live child:
eviction takes leaves first, so it never reaches a block while a descendant lives).  Each block
counts its live children (``below``), and a change travels up the parent chain only while it
flips a parent's liveness: O(1) for a request extending its own pinned chain, and one walk per
chain for a run of blocks changing together (``settle_chain``, ``unlink_run``).

The Evictor owns ``cached`` (what the policy may take) and tells this class which blocks
changed; this class owns ``live``, ``below`` and ``blocked`` and only reads ``cached``.
"""
from itertools import repeat
from operator import add

from hybridkv.cache.arena_pool import PageCountedSet
from hybridkv.cache.index import PARENT_BLOCK

CHAIN_RUN_MIN = 2       # a single block is settled alone


class Liveness:
    def __init__(self, pools, index, cached):
        self.index = index
        self.cached = cached                            # the Evictor's sets (read only here)
        self.live = {pk: set() for pk in pools}         # published, not cached or blocked
        self.below = {pk: {} for pk in pools}           # block -> its live children
        self.blocked = {pk: set() for pk in pools}      # cached with a live descendant
        for pk, pool in pools.items():                  # k-page blocks: their pages counted
            if pool.pages_per_block > 1:
                self.blocked[pk] = PageCountedSet(pool.pages_held_by)

    def settle(self, pk, b):
        """Re-derive whether block b is blocked and live; while its liveness flips, carry the
        change to its parent (and on up)."""
        self.settle_chain(pk, (b,))

    def chain_of(self, pk, blocks):
        """Whether ``blocks`` are published chain blocks given deepest first: each one's
        parent is the next one given (so each but the first has a child)."""
        ents = self.index.entries[pk]
        try:
            ups = list(map(PARENT_BLOCK, map(ents.__getitem__, blocks[:-1])))
            ents[blocks[-1]]
        except (KeyError, AttributeError, IndexError):  # unpublished, a parent missing, none
            return False
        return ups == (blocks[1:] if type(blocks) is list else list(blocks[1:]))

    def settle_chain(self, pk, blocks, chain=False, freed=False):
        """``settle`` of each of ``blocks`` (their cached state changed), in order: a block's
        blocked and live follow from its cached state and its live children; while its
        liveness flips, the change goes to its parent's count and on up -- except where the
        parent is the next block given (derived next anyway), so a chain given deepest first is
        walked once.  ``chain``: the caller found ``chain_of(pk, blocks)`` true.  ``freed``:
        every block was live (PINNED) and is cached now (a free's reads)."""
        ents, cached, below = self.index.entries[pk], self.cached[pk], self.below[pk]
        blocked, live = self.blocked[pk], self.live[pk]
        n = len(blocks)
        if n >= CHAIN_RUN_MIN and self._settle_cached_chain(pk, blocks, chain, freed):
            return
        for i, b in enumerate(blocks):
            nxt = blocks[i + 1] if i + 1 < n else None
            while b is not None:
                entry, is_cached, has_live = ents.get(b), b in cached, below.get(b, 0) > 0
                if is_cached and has_live:
                    blocked.add(b)
                else:
                    blocked.discard(b)
                now = entry is not None and (not is_cached or has_live)
                if now == (b in live):
                    break
                if now:
                    live.add(b)
                else:
                    live.discard(b)
                if entry is None or entry.parent is None:
                    break
                up = entry.parent.block
                below[up] = below.get(up, 0) + (1 if now else -1)
                b, nxt = (None if up == nxt else up), None

    def _settle_cached_chain(self, pk, blocks, chain=False, freed=False):
        """``settle_chain`` of a chain run given deepest first that was live and is all cached
        now (a free of a request's chain), set by set instead of block by block; False (nothing
        changed) when ``blocks`` is not such a run (``chain``: known to be a chain).  Block i
        had its child i-1 among its live children, so it stays live only while it has another
        (``below`` > 1; the deepest: > 0) or a block below it does: the first such block k and
        all above it stay live (blocked), the blocks below k die, and when none stays, the top
        one's parent loses a live child and settles on up.  ``freed``: known live and cached
        (``settle_chain``)."""
        cached, below = self.cached[pk], self.below[pk]
        live, n = self.live[pk], len(blocks)
        if not (chain or self.chain_of(pk, blocks)) or not freed and \
                not (live.issuperset(blocks) and cached.issuperset(blocks)):
            return False
        top = self.index.entries[pk][blocks[-1]].parent
        counts = list(map(below.get, blocks, repeat(0)))
        if counts[0] > 0:
            k = 0
        elif n == 1 or max(counts[1:]) <= 1:        # (most frees: one C pass, none stays)
            k = n
        else:
            k = next(i for i in range(1, n) if counts[i] > 1)
        dead, blocked = blocks[:k], self.blocked[pk]
        live.difference_update(dead)
        blocked.difference_update(dead)
        below.update(zip(blocks[1:k], repeat(0)))
        if k < n:
            if k:
                below[blocks[k]] = counts[k] - 1
            blocked.update(blocks[k:])
        elif top is not None:
            below[top.block] = below.get(top.block, 0) - 1
            self.settle(pk, top.block)
        return True

    def entered_run(self, pk, first, blocks):
        """Chain blocks ``blocks`` were just published under ``first`` (already settled), each
        the next one's child: each is a live child of a fresh (live, uncached) block, so
        nothing travels."""
        if not blocks:
            return
        live, below, blocked = self.live[pk], self.below[pk], self.blocked[pk]
        blocked.difference_update(blocks)
        live.update(blocks)
        parents = [first, *blocks[:-1]]             # each gains one live child
        below.update(zip(parents, map(add, map(below.get, parents, repeat(0)), repeat(1))))

    def unlink(self, pk, b, parent):
        """Block b left the index: its liveness leaves its parent's count."""
        self.below[pk].pop(b, None)
        self.blocked[pk].discard(b)
        if b in self.live[pk]:
            self.live[pk].discard(b)
            if parent is not None and parent.block in self.below[pk]:
                self.below[pk][parent.block] -= 1
                self.settle(pk, parent.block)

    def unlink_run(self, pk, blocks, parent):
        """``unlink`` of a chain run that left the index, deepest first, ``parent`` the top
        one's parent: only a live block changes a count, and each but the top one's parent
        left with the run."""
        below, body = self.below[pk], blocks[:-1]
        list(map(below.pop, body, repeat(None)))
        self.blocked[pk].difference_update(body)
        self.live[pk].difference_update(body)
        self.unlink(pk, blocks[-1], parent)

    def takeable(self, pk, b):
        return b in self.cached[pk] and b not in self.blocked[pk]

    def takeable_run(self, pk, blocks):
        """The takeable ones of ``blocks``, in order."""
        cached, blocked = self.cached[pk], self.blocked[pk]
        return [b for b in blocks if b in cached and b not in blocked]

    def check(self, pk):
        """Problems (empty list = sound): live / below / blocked agree with a recount from
        the index."""
        bad, count = [], {}
        ents = self.index.entries[pk]
        for b, e in ents.items():
            live = b not in self.cached[pk] or self.below[pk].get(b, 0) > 0
            if live != (b in self.live[pk]):
                bad.append(("live", pk, b))
            if live and e.parent is not None:
                count[e.parent.block] = count.get(e.parent.block, 0) + 1
        for b in ents:
            if self.below[pk].get(b, 0) != count.get(b, 0):
                bad.append(("live_below", pk, b, self.below[pk].get(b, 0), count.get(b, 0)))
            blocked = b in self.cached[pk] and count.get(b, 0) > 0
            if blocked != (b in self.blocked[pk]):
                bad.append(("blocked", pk, b))
        if not self.live[pk] <= set(ents) or not self.blocked[pk] <= set(ents):
            bad.append(("live-unpublished", pk))
        return bad
