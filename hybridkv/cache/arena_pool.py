"""ArenaPool: a pool whose blocks draw their memory from the block arena
(hybridkv.cache.arena): block b holds arena page ``phys[b]`` (its slot) from leaving FREE to
returning to FREE, and in a pool of k-page blocks the sub-pages ``reach`` took since
(hybridkv.cache.subpages); every page moves through the arena, whose take and give are the
spec's guards."""
import numpy as np

from hybridkv.cache.arena import ARENA_RUN_MIN, NO_PAGE
from hybridkv.cache.pool import Pool
from hybridkv.cache.tables import TransitionRefused
from hybridkv.errors import BadArgument
from spec.common import FREE


class PageCountedSet(set):
    """A set of blocks of a pool of k-page blocks that keeps the pages they hold
    (``pages_held_by(b)`` when b joins: a cached block's pages do not change while cached),
    so the evictor answers the pages eviction can take in O(1)."""

    def __init__(self, pages_held_by):
        super().__init__()
        self.pages_held_by = pages_held_by
        self.pages_of_block = {}      # block -> its pages when it joined
        self.pages = 0                # their sum

    def add(self, b):
        if b not in self:
            n = self.pages_of_block[b] = self.pages_held_by(b)
            self.pages += n
            super().add(b)

    def discard(self, b):
        if b in self:
            self.pages -= self.pages_of_block.pop(b)
            super().discard(b)

    def update(self, blocks):
        for b in blocks:
            self.add(b)

    def difference_update(self, blocks):
        for b in blocks:
            self.discard(b)


class ArenaPool(Pool):
    """A pool whose block b holds arena page ``phys[b]`` from leaving FREE to returning to
    FREE (``NO_PAGE`` meanwhile), and in a pool of k-page blocks the sub-pages ``reach``
    took since; ``num_pages`` spec records; a relocation moves to another free page."""

    def __init__(self, kind, group, arena, tensors, abi, ctx, checked=False,
                 on_transition=None):
        self.arena, self.key = arena, (kind, group.name)
        super().__init__(kind, group, arena.num_pages, tensors, abi, ctx, arena.device, checked,
                         on_transition)
        self.phys = [NO_PAGE] * self.n
        self.spare = None                     # no spare slot: relocation takes free pages
        self.pages_per_block = arena.pages_per_block(self.key)   # sub-pages a block spans

    def _make_storage(self, tensors, dtype, device):
        return self.arena.views(self.key, tensors, self.n_layers, dtype)

    def alloc(self):
        """A FREE block id, or None when the arena has no page for it to take."""
        return super().alloc() if self.arena.n_free else None

    def alloc_run(self, n):
        """At most as many FREE block ids as the arena has pages for them to take."""
        return super().alloc_run(min(n, self.arena.n_free))

    def reach(self, b, subs):
        """Block b (not FREE) takes its sub-pages ``subs`` it does not hold yet; how many."""
        return self.arena.reach(self.key, b, self.phys[b], subs)

    def reach_run(self, blocks, subs):
        """``reach`` of each of ``blocks`` (not FREE) to its sub-pages ``subs[i]``, in order,
        as one run (``Arena.reach_run``); how many pages they took."""
        phys = self.phys
        return self.arena.reach_run(self.key, blocks, [phys[b] for b in blocks], subs)

    def give_sub(self, b, sub):
        """Block b gives back its sub-page ``sub`` (False when it holds none)."""
        return self.arena.give_sub(self.key, b, self.phys[b], sub)

    def pages_held_by(self, b):
        """Pages block b holds now (0 while FREE)."""
        return self.arena.held_by(self, b)

    def sub_pages(self, b):
        """Block b's sub-pages 0..k-1 (``NO_PAGE`` where it holds none)."""
        return self.arena.pages_of(self.phys[b])

    def _moved(self, b, old, new):
        super()._moved(b, old, new)
        self._arena_moved(b, old, new)

    def _check_move(self, b, old, new):
        """A block leaving FREE takes the free list's top page (``spec.arena.can_take``), one
        returning gives back every page it holds (``can_give``): checked before its record
        changes, so a refusal leaves the block, the pool and the arena as they were."""
        if old == FREE:
            self.arena.check_take(self.key, 1)
        elif new == FREE:
            self.arena.check_give(self.key, b, self.phys[b])

    def _check_move_run(self, blocks, olds, news):
        """``_check_move`` of a run: each guard once over the pages it takes or gives."""
        leaving, entering = (olds == FREE) & (news != FREE), (news == FREE) & (olds != FREE)
        if leaving.any():
            self.arena.check_take(self.key, int(leaving.sum()))
        if entering.any():
            givers = blocks if entering.all() else np.asarray(blocks)[entering].tolist()
            self.arena.check_give_run(self.key, givers, list(map(self.phys.__getitem__,
                                                                  givers)))

    def _arena_moved(self, b, old, new):
        """Block b's pages follow its move (checked by ``_check_move``): its slot taken when
        it leaves FREE, every page it holds given back when it returns."""
        if old == FREE:
            self.phys[b] = self.arena.take(self.key, b, checked=False)
        elif new == FREE:
            self.arena.give(self.key, b, self.phys[b], checked=False)
            self.phys[b] = NO_PAGE

    def _moved_run(self, blocks, old, new):
        """A run leaving or entering FREE takes or gives its pages as one run
        (``Arena.take_run`` / ``give_run``: each guard once over the run's pages); a short
        run block by block (``_moved``); other runs as Pool's."""
        super()._moved_run(blocks, old, new)
        if old != FREE and new != FREE:
            return
        if len(blocks) < ARENA_RUN_MIN:
            for b in blocks:
                self._arena_moved(b, old, new)
        elif old == FREE:
            for b, page in zip(blocks, self.arena.take_run(self.key, blocks, checked=False)):
                self.phys[b] = page
        else:
            self.arena.give_run(self.key, blocks, [self.phys[b] for b in blocks],
                                checked=False)
            for b in blocks:
                self.phys[b] = NO_PAGE

    def _fresh_slot(self, b, st):
        if not self.arena.n_free:
            raise TransitionRefused(self.kind, st, "relocate")
        return self.arena.take(self.key, b)

    def _retire_slot(self, b, slot):
        self.arena.move_slot(self.key, b, slot, self.phys[b])

    def _check_slots(self):
        return []                             # pages: Arena.check, over every pool at once

    def check_blocks(self, blocks):
        """Pool.check_blocks, and: a held block's page is owned by this block of this pool, a
        FREE block holds no page."""
        bad, arena = super().check_blocks(blocks), self.arena
        for b in blocks:
            page = self.phys[b]
            if self.recs.state(b) == FREE:
                if page != NO_PAGE:
                    bad.append(("page-of-free-block", b, page))
            elif page == NO_PAGE or arena.owner_of(page) != (*self.key, b):
                bad.append(("page-owner", b, page))
        return bad

    def load_records(self, recs):
        raise BadArgument("an arena pool takes no abstract start state", self.key)
