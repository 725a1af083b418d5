"""Admission: one rule (spec.funnel.can_admit_objects, scalar) for objects in transit, and per
pool "free + evictable covers the new blocks".  Refusal is decided in O(pools) from the
writer's closed-form counts (ObjectWriter.blocks_needed), before any block is touched, and
changes nothing.  ``pool_sizes`` sizes pools from the same counts.

An admitted allocation's blocks are *reserved* while eviction makes room for them
(``make_room``): they count as in transit before they are written, so a spill that an
eviction starts is admitted (spec can_admit_objects, the same rule) only beside them -- the
cap holds at every step, as it does in the spec, where every object enters transit through
that guard one at a time.

In arena mode (``arena``: hybridkv.cache.arena.Arena) the capacity is the arena's pages: an
allocation's blocks (one page each, its slot) plus the sub-pages its window positions and
snapshots reach (``subs``: hybridkv.cache.subpages, where a pool's blocks span several pages)
against free pages plus every pool's takeable cached blocks, and
``make_room`` lets the arena pick which pool gives pages back (each through its own eviction).
"""

from hybridkv.errors import AdmissionRefused, RequestTooLarge
from spec.funnel import can_admit_objects


def _new_pages(need, subs):
    """Pages new blocks take now: one each (its slot) and the sub-pages ``subs`` they reach."""
    return sum(need.values()) + sum((subs or {}).values())


class Admission:
    def __init__(self, pools, evictor, cap, transit=lambda: 0, arena=None):
        self.pools, self.evictor, self.cap = pools, evictor, cap
        self.arena = arena              # one block arena: its pages are the capacity, or None
        self.transit = transit          # disk spills / loads and external holders in transit
        self.reserved = 0               # blocks of an admitted allocation not yet written

    def in_transit(self):
        return sum(p.n_writing for p in self.pools.values()) + self.transit() + self.reserved

    def make_room(self, need, subs=None):
        """Evict (and spill) for an admitted allocation (``check`` passed): its blocks are
        reserved meanwhile, so a spill enters transit only beside them under the cap; the
        check counted only blocks eviction can take, so this does not run short."""
        total = sum(need.values())
        self.reserved += total
        try:
            if self.arena is not None:
                self.arena.make_room(_new_pages(need, subs), self.pools, self.evictor)
            for pk, k in need.items():
                self.evictor.make_room(pk, k)     # arena mode: the pool already has k free
        finally:
            self.reserved -= total

    def held_back(self, protect):
        """Pool key -> what the ``protect``ed reads (cached blocks about to be pinned) hold of
        what eviction could take (blocks; arena mode: their pages): counted once per
        allocation, then passed to ``check`` / ``fits`` as ``held``.  ``protect``: Reads."""
        held = {}
        for pk, run in protect.runs():
            blocks = self.evictor.liveness.takeable_run(pk, run.blocks)
            if blocks:
                held[pk] = held.get(pk, 0) + (len(blocks) if self.arena is None else
                                              self.arena.held_by_run(self.pools[pk], blocks))
        return held

    def check(self, need, held=None, subs=None):
        """Raise AdmissionRefused (RequestTooLarge when even an empty cache could not take
        it) unless every pool can supply its blocks from free + evictable ones, minus what
        cached blocks about to be pinned hold (``held``, from ``held_back``), and the cap
        admits them all."""
        short, too_large = self._verdict(need, held, subs)
        if too_large:
            raise RequestTooLarge("allocation can never fit this cache", too_large)
        if short:
            raise AdmissionRefused("allocation refused", short)

    def fits(self, need, held=None, subs=None, extra=None, extra_transit=0):
        """``check`` would pass (and nothing changes either way), with ``extra`` (pool key
        -> blocks, arena mode: pages) more available and ``extra_transit`` fewer objects in
        transit.  O(pools)."""
        short, too_large = self._verdict(need, held, subs, extra, extra_transit)
        return not short and not too_large

    def _verdict(self, need, held, subs, extra=None, extra_transit=0):
        """(short, too_large): what ``check`` refuses, per pool (or the arena, the cap)."""
        held = dict(held or {})       # pool key -> blocks (arena mode: their pages)
        total = sum(need.values())
        for pk, n in (extra or {}).items():      # more available: fewer held back
            held[pk] = held.get(pk, 0) - n
        short, too_large = self._short_pages(need, held, subs) if self.arena is not None \
            else self._short_blocks(need, held)
        n = self.in_transit() - extra_transit
        if not can_admit_objects(n, total, self.cap):
            short["in_transit"] = (total, self.cap - n)
            if not can_admit_objects(0, total, self.cap):
                too_large["in_transit"] = (total, self.cap)
        return short, too_large

    def _short_blocks(self, need, held):
        """Per pool: its blocks against its free + takeable cached ones."""
        short, too_large = {}, {}
        for pk, k in need.items():
            avail = self.evictor.available(pk) - held.get(pk, 0)
            if k > avail:
                short[f"{pk[0]}/{pk[1]}"] = (k, avail)
            if k > self.pools[pk].n:
                too_large[f"{pk[0]}/{pk[1]}"] = (k, self.pools[pk].n)
        return short, too_large

    def _short_pages(self, need, held, subs):
        """Arena mode: every pool's new pages together against the arena's free pages plus
        every pool's takeable cached blocks."""
        total = _new_pages(need, subs)
        avail = self.arena.available(self.pools, self.evictor) - sum(held.values())
        short = {"arena": (total, avail)} if total > avail else {}
        num_pages = self.arena.num_pages
        return short, ({"arena": (total, num_pages)} if total > num_pages else {})

    def admits(self, extra):
        """The cap admits ``extra`` more objects in transit now."""
        return can_admit_objects(self.in_transit(), extra, self.cap)
