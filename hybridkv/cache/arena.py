"""One block arena (opt-in: ``CacheManager(layout, num_pages=N)``): every (kind, group) pool
draws its blocks' memory from one aligned buffer of ``num_pages`` equal pages.

A page holds one block of any pool: ``page_nbytes`` is the largest pool block
(``ModelLayout.page_nbytes``), smaller blocks are padded up (``ModelLayout.page_padding``).
Inside a page a pool's tensors sit one after the other, each layer-major, so a pool's tensor
is an as_strided view ``[n_layers, num_pages, rows, dim]`` whose page stride is the page bytes:
a block table's slot IS the arena page id, one id space for every kind (vLLM's single
block-id space).

State routing, page by page (``spec.arena``, proven over every pool's block machine in
``proofs.arena``): a page belongs to exactly one block of one pool key from the moment the
block leaves FREE to the moment it returns to FREE (``ArenaPool._moved``: every path, evict,
reject, drop_stale, load_bad); only a FREE page gets a new owner and only its owner gives it
back: ``take``/``give`` call the spec's ``can_take``/``can_give`` and refuse anything else; a
FREE block holds no page (``phys[b] == NO_PAGE``).  Logical block ids stay per pool (each pool
keeps ``num_pages`` spec records).

What moves between kinds is capacity: admission counts total pages against free pages plus
every pool's takeable cached blocks; when pages are short the arena picks the pool that gives
one back (the giver, ``ranked``'s first: the victim cheapest to recompute per page, dead
ones first) and that pool evicts its own victim through its own path (``Evictor.make_room``:
its own policy, the disk spill on eviction).  Never one global order across kinds.

Blocks of several pages (``block_pages``: pool key -> k): an engine that keeps the bytes itself
with one id per page-sized unit (vLLM: one KV block id per block_size tokens, while a window
page spans W'/block_size of them) gives a pool's blocks up to k page ids each, sub-page s for
the block's s-th k-th of its rows.  A block takes its first page (sub-page 0, its slot: the
block table names the block by it) when it leaves FREE; ``reach`` takes later sub-pages as
the positions they hold are reached (hybridkv.cache.subpages), ``give_sub`` gives one back
once the window slid past it, the rest return when the block returns to FREE.  Every page is
taken and given back through the same guards and owned by exactly that block of that pool
(``spec.arena.block_pages_ok`` with k: between 1 and k while held); ``pages_of(slot)`` lists
the k sub-pages (``NO_PAGE`` where one is not held).  A cached (evictable) block of such a
pool is a window snapshot, holding the sub-pages its rows need: ``available`` and the giver
count the pages each such block holds.  hybridkv's own tensors keep the block's rows at its
first page (every page is as large as the largest block).
"""
from itertools import chain, compress, repeat

import numpy as np
import torch

from hybridkv.cache.storage import DTYPES
from hybridkv.errors import AdmissionRefused, BadArgument, InvariantViolation, LayoutError
from hybridkv.layout import ITEMSIZE, slot_bytes
from spec.arena import (NO_KIND, PAGE_FREE, PAGE_OWNED, block_pages_ok, can_give, can_take,
                        page_owner_ok)
from spec.common import FREE
from spec.funnel import GPU_BLOCK_ALIGN

ARENA_RUN_MIN = 8     # a shorter run takes or gives its pages block by block

NO_PAGE = -1            # phys[b] of a FREE block: it holds no page
NOBODY = (NO_KIND, None, NO_PAGE)   # (kind, group, block) of a FREE page's owner: none
COVERED = 6             # record field after the common six: the position a block covers (h / hi)


class Arena:
    def __init__(self, num_pages, page_nbytes, device="cpu", block_pages=None):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
            raise BadArgument("num_pages must be a positive int", num_pages)
        block_pages = dict(block_pages or {})
        for pk, k in block_pages.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise BadArgument("pages per block must be a positive int", (pk, k))
        if page_nbytes <= 0 or page_nbytes % GPU_BLOCK_ALIGN:
            raise BadArgument("page bytes must be a positive multiple of the alignment",
                              page_nbytes)
        self.num_pages, self.page_nbytes, self.device = num_pages, page_nbytes, device
        total = num_pages * page_nbytes
        raw = torch.empty(total + GPU_BLOCK_ALIGN, dtype=torch.uint8, device=device)
        start = (-raw.data_ptr()) % GPU_BLOCK_ALIGN
        self.buffer = raw[start:start + total]               # every page starts aligned
        self.page_state = bytearray([PAGE_FREE]) * num_pages  # spec.arena PAGE_FREE / PAGE_OWNED
        self.owner = [None] * num_pages                      # page -> pool key, None while free
        self.owner_block = [NO_PAGE] * num_pages             # page -> block of that pool holding it
        self.free = list(range(num_pages - 1, -1, -1))       # stack of free pages
        self.pages_held = {}                                 # pool key -> pages it owns
        self.block_pages = block_pages                       # pool key -> pages a block takes
        self.more_pages = {}        # first page -> sub-pages 1..k-1 of its block (or NO_PAGE)

    @property
    def n_free(self):
        return len(self.free)

    # -- memory ------------------------------------------------------------------------------
    def views(self, pool_key, tensors, n_layers, dtype):
        """name -> ``[n_layers, num_pages, rows, dim]`` views of pool ``pool_key``'s tensors
        over the buffer: tensor after tensor inside each page, layer j of a tensor at
        ``j * slot_bytes`` after its start (the pool's block bytes, padded to the page)."""
        itemsize, offset, out = ITEMSIZE[dtype], 0, {}
        typed = self.buffer.view(DTYPES[dtype])
        for name, (rows, dim) in tensors.items():
            layer_nbytes = slot_bytes(rows, dim, dtype)
            t = typed.as_strided((n_layers, self.num_pages, rows, dim),
                                 (layer_nbytes // itemsize, self.page_nbytes // itemsize, dim, 1),
                                 typed.storage_offset() + offset // itemsize)
            if t.is_floating_point():
                t.fill_(float("nan"))     # a read of a row nobody wrote poisons the output
            out[name] = t
            offset += n_layers * layer_nbytes
        if offset > self.page_nbytes:
            raise LayoutError("a pool block is larger than the arena page",
                              (pool_key, offset, self.page_nbytes))
        self.pages_held[pool_key] = 0
        return out

    def pages_per_block(self, pool_key):
        return self.block_pages.get(pool_key, 1)

    def pages_of(self, page):
        """Sub-pages 0..k-1 of the block whose first page is ``page`` (``NO_PAGE`` where the
        block holds none)."""
        return [page, *self.more_pages.get(page, ())]

    def held_pages(self, page):
        """The pages the block whose first page is ``page`` holds."""
        more = self.more_pages.get(page)
        if more is None:                      # a one-page block's slot (or no block's)
            return [page] if page != NO_PAGE else []
        return [p for p in (page, *more) if p != NO_PAGE]

    # -- pages change owner only while FREE ----------------------------------------------------
    def _need_free(self, n):
        """n pages are on the free list (admission reserved them before any page moves)."""
        if n > len(self.free):
            raise InvariantViolation("arena_pages", "no free page: admission reserves them")

    def _take_page(self, pool_key, block):
        """The free page on top of the free list, now owned by block ``block`` of pool
        ``pool_key``.  ``spec.arena.can_take`` refuses a page that is not FREE (a free list
        naming a held page) and nothing changes."""
        self._need_free(1)
        page = self.free[-1]
        if not can_take(self.page_state[page]):
            raise InvariantViolation("arena_routing", ("page taken while owned", page,
                                                       self.owner_of(page), pool_key, block))
        return self._own_top(pool_key, block)

    def _own_top(self, pool_key, block):
        """The page on top of the free list (``can_take`` checked by the caller), owned now:
        ``_own_tops`` of one block without its run's slicing."""
        self._need_free(1)
        page = self.free.pop()
        self.page_state[page], self.owner[page], self.owner_block[page] = \
            PAGE_OWNED, pool_key, block
        self.pages_held[pool_key] += 1
        return page

    def _own_tops(self, pool_key, blocks):
        """``_own_top`` for each of ``blocks`` in order (``can_take`` checked by the caller):
        the pages on top of the free list, the top one first, owned now by pool ``pool_key``,
        page i by block ``blocks[i]``."""
        n = len(blocks)
        if not n:
            return []
        self._need_free(n)
        pages = self.free[:-n - 1:-1]            # the order n pops take them in
        del self.free[-n:]
        state, owner, owner_block = self.page_state, self.owner, self.owner_block
        for page, b in zip(pages, blocks):
            state[page], owner[page], owner_block[page] = PAGE_OWNED, pool_key, b
        self.pages_held[pool_key] += n
        return pages

    def _one_owner(self, pages):
        """Every one of ``pages`` has the same owner (kind, group, block), or every one is
        FREE."""
        blocks = set(map(self.owner_block.__getitem__, pages))
        return len(blocks) == 1 and len(set(map(self.owner.__getitem__, pages))) == 1

    def _check_give(self, pool_key, block, pages):
        """``spec.arena.can_give`` of each of ``pages`` given back by ``block`` of
        ``pool_key``.  Pages that all have one owner (a block's own pages, the usual give)
        ask the guard once: its verdict on the first is its verdict on each."""
        if len(pages) > 1 and self._one_owner(pages):
            pages = pages[:1]
        for p in pages:
            if not can_give(*self.owner_of(p), *pool_key, block):
                raise InvariantViolation("arena_routing", ("page given back by a non-owner", p,
                                                           self.owner_of(p), pool_key, block))

    def _check_take_top(self, pool_key, n):
        """The n pages on top of the free list (the order n takes pop them in) exist and may
        be taken: ``spec.arena.can_take`` once over them (array mode)."""
        self._need_free(n)
        tops = self.free[:-n - 1:-1]
        ok = _per_page(can_take(np.frombuffer(self.page_state, np.uint8)[tops]), n)
        if not ok.all():
            page = tops[int(np.argmin(ok))]
            raise InvariantViolation("arena_routing", ("page taken while owned", page,
                                                       self.owner_of(page), pool_key))

    def _check_give_run(self, pool_key, pages, givers):
        """Block ``givers[i]`` of pool ``pool_key`` owns page ``pages[i]``, for every i:
        ``spec.arena.can_give`` once over them (array mode)."""
        n, keys = len(pages), list(map(self.owner.__getitem__, pages))
        owned_by = np.fromiter(map(self.owner_block.__getitem__, pages), np.int64, n)
        if keys.count(pool_key) == n:           # one owner pool: its kind and group columns
            kinds, groups = pool_key            # are constant (one value stands for them)
        else:
            owners = np.array(list(map(self.owner_of, pages)), dtype=object).reshape(-1, 3)
            kinds, groups = owners[:, 0], owners[:, 1]
        ok = _per_page(can_give(kinds, groups, owned_by, pool_key[0], pool_key[1],
                                np.asarray(givers, np.int64)), n)
        if not ok.all():
            i = int(np.argmin(ok))
            raise InvariantViolation("arena_routing", ("page given back by a non-owner",
                                                       pages[i], self.owner_of(pages[i]),
                                                       pool_key, givers[i]))

    def take(self, pool_key, block, checked=True):
        """Block ``block`` of pool ``pool_key`` just left FREE: its first page (its slot),
        taken through ``spec.arena.can_take`` (``checked`` False: the caller checked it,
        ``check_take``); no sub-page yet."""
        page = self._take_page(pool_key, block) if checked else self._own_top(pool_key, block)
        self._no_subs_yet(pool_key, page)
        return page

    def _no_subs_yet(self, pool_key, page):
        """A k-page block just took its slot ``page``: sub-pages 1..k-1 not held yet."""
        k = self.pages_per_block(pool_key)
        if k > 1:
            self.more_pages[page] = [NO_PAGE] * (k - 1)

    def reach(self, pool_key, block, page, subs):
        """Sub-pages ``subs`` (1..k-1) of the block whose first page is ``page``, taken now
        where the block does not hold them yet: all or nothing (too few free pages, or a block
        that is not the slot's owner, changes nothing)."""
        more = self.more_pages.get(page)
        if more is None or not _sub_pages_of(subs, more):
            raise BadArgument("no such sub-page of the block", (pool_key, block, page, subs))
        self._check_give(pool_key, block, [page])        # only the block's owner grows it
        missing = sorted({s for s in subs if more[s - 1] == NO_PAGE})
        self._need_free(len(missing))
        for s in missing:
            more[s - 1] = self._take_page(pool_key, block)
        return len(missing)

    def reach_run(self, pool_key, blocks, pages, subs):
        """``reach`` for each of ``blocks`` (block i's first page ``pages[i]``, its sub-pages
        ``subs[i]``), in order, taking the same pages in the same order; a block that holds
        all its sub-pages already takes none and is asked nothing.  With ``ARENA_RUN_MIN`` or
        more blocks growing, ``spec.arena.can_give`` (only a slot's owner grows it) and
        ``can_take`` (only FREE pages) are each evaluated once over the run's pages (array
        mode), and a refusal anywhere changes nothing.  Returns the pages taken."""
        grow, more_pages = [], self.more_pages     # (block, page, its more_pages, missing)
        for b, page, want in zip(blocks, pages, subs):
            more = more_pages.get(page)
            if more is None or not _sub_pages_of(want, more):
                raise BadArgument("no such sub-page of the block", (pool_key, b, page, want))
            if type(want) is range and want.step == 1:     # sub-pages in a row (subpages')
                held = more[want.start - 1:want.stop - 1]
                missing = want if held.count(NO_PAGE) == len(held) else \
                    [s for s in want if more[s - 1] == NO_PAGE]
            else:
                missing = sorted({s for s in want if more[s - 1] == NO_PAGE})
            if missing:
                grow.append((b, page, more, missing))
        if len(grow) < ARENA_RUN_MIN:
            return sum(self.reach(pool_key, b, page, missing) for b, page, _, missing in grow)
        self._check_give_run(pool_key, [page for _, page, _, _ in grow],
                             [b for b, _, _, _ in grow])
        n = sum(len(missing) for _, _, _, missing in grow)
        self._check_take_top(pool_key, n)
        taken = iter(self._own_tops(pool_key, [b for b, _, _, missing in grow
                                               for _ in missing]))
        for _, _, more, missing in grow:
            for s in missing:
                more[s - 1] = next(taken)
        return n

    def give_sub(self, pool_key, block, page, sub):
        """Sub-page ``sub`` of the block whose first page is ``page`` is free again (the
        window slid past its positions); by its owner only (``spec.arena.can_give``),
        otherwise nothing changes.  False when the block does not hold it."""
        more = self.more_pages.get(page)
        if more is None or not 1 <= sub <= len(more):
            raise BadArgument("no such sub-page of the block", (pool_key, block, page, sub))
        p = more[sub - 1]
        if p == NO_PAGE:
            return False
        self._check_give(pool_key, block, [page, p])
        more[sub - 1] = NO_PAGE
        self._give_pages(pool_key, [p])
        return True

    def check_take(self, pool_key, n):
        """``take_run`` of n blocks would pass ``spec.arena.can_take`` (else it raises); one
        block: the guard on the top page alone, as ``take`` asks it."""
        if n != 1 or not self.free:
            self._check_take_top(pool_key, n)
        elif not can_take(self.page_state[self.free[-1]]):
            page = self.free[-1]
            raise InvariantViolation("arena_routing", ("page taken while owned", page,
                                                       self.owner_of(page), pool_key))

    def check_give(self, pool_key, block, page):
        """``give`` would pass ``spec.arena.can_give`` (else it raises)."""
        self._check_give(pool_key, block, self.held_pages(page))

    def check_give_run(self, pool_key, blocks, slots):
        """``give_run`` would pass ``spec.arena.can_give`` (else it raises)."""
        self._check_give_run(pool_key, *self._pages_given(pool_key, blocks, slots))

    def _pages_given(self, pool_key, blocks, slots):
        """(pages, the block giving each) of blocks whose slots are ``slots`` going FREE."""
        k = self.pages_per_block(pool_key)
        if k == 1 and NO_PAGE not in slots:
            return slots, blocks                # one-page blocks: each holds its slot alone
        subs = list(map(self.more_pages.get, slots)) if k > 1 and NO_PAGE not in slots else ()
        if subs and None not in subs:           # every block with its k - 1 sub-page entries
            pages = list(chain.from_iterable(zip(slots, *zip(*subs))))   # block by block
            givers = list(chain.from_iterable(zip(*repeat(blocks, k))))
            if NO_PAGE in pages:
                held = list(map(NO_PAGE.__ne__, pages))
                pages, givers = list(compress(pages, held)), list(compress(givers, held))
            return pages, givers
        pages, givers = [], []
        for b, slot in zip(blocks, slots):
            held = self.held_pages(slot)
            pages += held
            givers += [b] * len(held)
        return pages, givers

    def give(self, pool_key, block, page, checked=True):
        """Every page of the block whose slot is ``page`` is free again: block ``block`` of
        pool ``pool_key`` returned to FREE.  ``spec.arena.can_give`` refuses a give by anyone
        but a page's owner (a FREE page has none) and nothing changes (``checked`` False: the
        caller checked it, ``check_give``)."""
        pages = self.held_pages(page)
        if checked:
            self._check_give(pool_key, block, pages)
        self.more_pages.pop(page, None)
        self._give_pages(pool_key, pages)

    def _give_pages(self, pool_key, pages):
        """Each of ``pages`` (owned by pool ``pool_key``) FREE again, owned by nobody, pushed on
        the free list in order."""
        state, owner, owner_block = self.page_state, self.owner, self.owner_block
        for p in pages:
            state[p], owner[p], owner_block[p] = PAGE_FREE, None, NO_PAGE
        self.free += pages
        self.pages_held[pool_key] -= len(pages)

    def take_run(self, pool_key, blocks, checked=True):
        """``take`` for each of ``blocks`` (distinct, just left FREE), in order: their slots,
        ``spec.arena.can_take`` evaluated once over the pages (array mode; ``checked`` False:
        the caller checked them, ``check_take``)."""
        n = len(blocks)
        if checked:
            self._check_take_top(pool_key, n)
        slots = self._own_tops(pool_key, blocks)
        k = self.pages_per_block(pool_key)
        if k > 1:                                    # ``_no_subs_yet`` of each, at once
            self.more_pages.update(zip(slots, map(list, repeat((NO_PAGE,) * (k - 1)))))
        return slots

    def give_run(self, pool_key, blocks, slots, checked=True):
        """``give`` for each of ``blocks`` (distinct, back to FREE; block i's slot
        ``slots[i]``), in order: every page they hold free again, ``spec.arena.can_give``
        evaluated once over all those pages and their givers (array mode); a page its giver
        does not own refuses the whole run and nothing changes (``checked`` False: the caller
        checked them, ``check_give_run``)."""
        pages, givers = self._pages_given(pool_key, blocks, slots)
        if checked:
            self._check_give_run(pool_key, pages, givers)
        more = self.more_pages
        if more:
            for slot in slots:
                more.pop(slot, None)
        self._give_pages(pool_key, pages)

    def move_slot(self, pool_key, block, old, new):
        """A relocation moved the block from first page ``old`` to ``new`` (taken): ``old``
        is free again, the sub-pages stay the block's."""
        self._check_give(pool_key, block, [old])
        if old in self.more_pages:
            self.more_pages[new] = self.more_pages.pop(old)
        self._give_pages(pool_key, [old])

    def owner_of(self, page):
        """(kind, group, block) owning ``page``; ``NOBODY`` while it is FREE."""
        key = self.owner[page]
        return NOBODY if key is None else (*key, self.owner_block[page])

    # -- capacity across kinds ----------------------------------------------------------------
    def available(self, pools, evictor):
        """Pages an allocation could have now: free pages plus the pages of every pool's
        cached blocks eviction can take (Evictor.available counts only those, beside its free
        blocks; a pool of k-page blocks: the pages they hold)."""
        return self.n_free + sum(evictor.takeable_pages(pk) for pk in pools)

    def held_by(self, pool, b):
        """Pages block ``b`` of ``pool`` holds now."""
        page = pool.phys[b]
        if page == NO_PAGE:
            return 0
        more = self.more_pages.get(page)      # its slot, and the sub-pages it holds
        return 1 + len(more) - more.count(NO_PAGE) if more else 1

    def held_by_run(self, pool, blocks):
        """Pages ``blocks`` of ``pool`` hold now together (``held_by`` summed; a pool of
        one-page blocks: the blocks holding a page)."""
        phys = pool.phys
        if pool.pages_per_block == 1:
            return len(blocks) - list(map(phys.__getitem__, blocks)).count(NO_PAGE)
        return sum(self.held_by(pool, b) for b in blocks)

    def ranked(self, pools, evictor):
        """The pools that could give a page back, cheapest first: (cost, pool key) where cost
        is (FLOPs a hit through the pool's own victim saves per page -- covered tokens x
        layers, the evictor's rule; 0 for a victim no lookup can reach --, minus the pages
        the pool holds: more pages wins a tie, then the pool's place in ``pools``)."""
        out = []
        for place, (pk, pool) in enumerate(pools.items()):
            b = evictor.victim(pk)
            if b is None:
                continue
            saved = pool.recs[b][COVERED] * pool.n_layers / max(1, self.held_by(pool, b)) \
                if evictor.index.reachable(pool.refs[b]) else 0
            out.append(((saved, -self.pages_held[pk], place), pk))
        return sorted(out)

    def _givers(self, pools, evictor):
        """``ranked`` for ``make_room``: one pool is the giver whenever it has a victim, with
        no cost to weigh (None: no rival reads it)."""
        if len(pools) == 1:
            pk = next(iter(pools))
            return [] if evictor.victim(pk) is None else [(None, pk)]
        return self.ranked(pools, evictor)

    def make_room(self, num_pages, pools, evictor):
        """Until ``num_pages`` pages are free: the giver (``ranked``'s first) evicts its victim,
        through its own path (Evictor.evict_run: its policy, the disk spill on eviction).
        With the ancestors that victim leaves as the next victims, as one run, while the
        giver would be ranked first again for each of them (``_keeps_giving``): the pages go
        as one giver choice per page would give them.  Admission counted only takeable
        blocks, so this does not run short."""
        while self.n_free < num_pages:
            ranked = self._givers(pools, evictor)
            if not ranked:
                raise AdmissionRefused("arena exhausted", {"arena": (num_pages, self.n_free)})
            (cost, pk), rival = ranked[0], (ranked[1][0] if len(ranked) > 1 else None)
            if pools[pk].pages_per_block > 1:                # one page per choice
                evictor.evict_run(pk, 1)
                continue
            keep = None if len(pools) == 1 else \
                self._keeps_giving(pk, evictor.index, cost[2], rival)   # (one pool: no rival,
            evictor.evict_run(pk, num_pages - self.n_free, keep)       # nothing elsewhere)

    def _keeps_giving(self, pk, index, place, rival):
        """``keep`` for Evictor.evict_run of giver ``pk`` (one-page blocks, ranked first,
        ``place`` its place in the pools; ``rival``: the second's cost, None if none):
        ancestor p goes next in the same run when dropping the block before it leaves nothing
        dead in another pool (which would give that pool a victim of cost 0) and, against a
        rival, p is left dead and its cost then -- 0 FLOPs saved, the giver holding one page
        less per block gone -- still ranks first (the rival's victim and cost do not change:
        nothing of its own went)."""
        def keep(prev, p, dead, gone):
            if index.kills_elsewhere(*pk, prev):
                return False
            if rival is None:
                return True
            return dead and (0, gone - self.pages_held[pk], place) < rival
        return keep

    # -- checks and stats -----------------------------------------------------------------------
    def check(self, pools):
        """Problems (empty list = sound).  The spec's state routing (``spec.arena_system``:
        ``arena_routing``, ``arena_accounting``, ``page_count``), through its per-page and
        per-block rules: a FREE page has no owner and an OWNED one has one, every non-FREE
        block owns between one and its pool's ``block_pages`` pages and a FREE block none,
        owned pages == the pages the non-FREE blocks name.  And the runtime's own bookkeeping:
        a block's slot and sub-pages name exactly the pages it owns (so no page is held twice
        and none leaks), a FREE block holds no slot, free pages sit on the free list once, the
        per-owner counts agree."""
        bad, owned = [], {}
        for page in range(self.num_pages):
            kind, group, block = self.owner_of(page)
            if not page_owner_ok(self.page_state[page], kind):
                bad.append(("page-owner-state", page, self.page_state[page], self.owner[page]))
            if kind != NO_KIND:
                owned.setdefault(((kind, group), block), []).append(page)
        n_owned, n_held = sum(map(len, owned.values())), 0
        for pk, pool in pools.items():
            for b, rec in enumerate(pool.recs):
                pages, page = owned.pop((pk, b), []), pool.phys[b]
                if rec.st != FREE:
                    n_held += len(self.held_pages(page)) if page != NO_PAGE else 0
                if not block_pages_ok(rec.st, len(pages), self.pages_per_block(pk)):
                    bad.append(("block-pages", pk, b, rec.st, pages))
                if rec.st == FREE:
                    if page != NO_PAGE:
                        bad.append(("page-of-free-block", pk, b, page))
                elif page not in pages or sorted(self.held_pages(page)) != sorted(pages):
                    bad.append(("page-owner", pk, b, page))
        if owned or n_owned != n_held:
            bad.append(("page-leaked", n_owned, n_held, sorted(owned)[:3]))
        if n_owned + len(self.free) != self.num_pages or sorted(self.free) != [
                p for p in range(self.num_pages) if self.page_state[p] == PAGE_FREE]:
            bad.append(("free-list", len(self.free), n_owned))
        held = {pk: sum(o == pk for o in self.owner) for pk in self.pages_held}
        if held != self.pages_held:
            bad.append(("pages-held", self.pages_held, held))
        return bad

    def stats(self, pools):
        """Pages free / used per owner and the padding waste (bytes padded / bytes of pages):
        per pool, and over the pages held now."""
        used = {f"{k}/{g}": n for (k, g), n in self.pages_held.items()}
        padded = {f"{k}/{g}": 1 - pools[(k, g)].block_nbytes / self.page_nbytes
                  for (k, g) in self.pages_held}
        n_used = self.num_pages - self.n_free
        waste = sum(padded[name] * n for name, n in used.items()) / n_used if n_used else 0.0
        return {"pages": self.num_pages, "page_bytes": self.page_nbytes, "free": self.n_free,
                "used": used, "padding_waste": {**padded, "held": waste}}


def _sub_pages_of(subs, more):
    """Every one of ``subs`` names a sub-page 1..k-1 of a block whose sub-pages are
    ``more``."""
    if type(subs) is range and subs.step > 0:
        return not subs or (subs.start >= 1 and subs[-1] <= len(more))
    return not subs or (min(subs) >= 1 and max(subs) <= len(more))


def _per_page(verdict, n):
    """A guard's verdict over n pages as n bools (a guard constant in its columns answers one
    value for all of them)."""
    return np.broadcast_to(np.asarray(verdict, dtype=bool), (n,))
