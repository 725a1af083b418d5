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
one back (``giver``: the victim cheapest to recompute per page, dead ones first) and that pool
evicts its own victim through its own path (``Evictor.make_room``: its own policy, the disk
spill on eviction).  Never one global order across kinds.

Blocks of several pages (``block_pages``: pool key -> k): an engine that keeps the bytes itself
with one id per page-sized unit (vLLM: one KV block id per block_size tokens, while a window
page spans W'/block_size of them) gives a pool's blocks k page ids each: every one taken and
given back through the same guards, owned by the block, counted k times by admission and the
giver (``spec.arena.block_pages_ok`` with k); the block table names the block by its first
page (its slot), ``pages_of(slot)`` lists all k.  hybridkv's own tensors keep the block's rows
at its first page (every page is as large as the largest block).
"""
import torch

from hybridkv.cache.pool import ObjRef, Pool
from hybridkv.cache.storage import DTYPES
from hybridkv.cache.tables import TransitionRefused
from hybridkv.errors import AdmissionRefused, BadArgument, InvariantViolation, LayoutError
from hybridkv.layout import ITEMSIZE, slot_bytes
from spec.arena import (NO_KIND, PAGE_FREE, PAGE_OWNED, block_pages_ok, can_give, can_take,
                        page_owner_ok)
from spec.common import FREE
from spec.funnel import GPU_BLOCK_ALIGN

NO_PAGE = -1            # phys[b] of a FREE block: it holds no page
NOBODY = (NO_KIND, None, NO_PAGE)   # (kind, group, block) of a FREE page's owner: none
COVERED = 6             # record field after the common six: the position a block covers (h / hi)


class Arena:
    def __init__(self, num_pages, page_nbytes, device="cpu", block_pages=None):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
            raise BadArgument("num_pages must be a positive int", num_pages)
        block_pages = dict(block_pages or {})
        for pk, k in block_pages.items():
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_pages:
                raise BadArgument("pages per block must be an int in [1, num_pages]", (pk, k))
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
        self.more_pages = {}                                 # first page -> the block's others

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

    def pages(self, need):
        """Pages the blocks ``need`` (pool key -> blocks) take."""
        return sum(k * self.block_pages.get(pk, 1) for pk, k in need.items())

    def pages_of(self, page):
        """Every page of the block whose first page is ``page``."""
        return [page, *self.more_pages.get(page, ())]

    # -- pages change owner only while FREE ----------------------------------------------------
    def take(self, pool_key, block):
        """The free pages on top of the free list (``pages_per_block``), now owned by block
        ``block`` of pool ``pool_key`` (which just left FREE): the first one, its slot.
        ``spec.arena.can_take`` refuses a page that is not FREE (a free list naming a held
        page) and nothing changes."""
        k = self.pages_per_block(pool_key)
        if len(self.free) < k:
            raise InvariantViolation("arena_pages", "no free page: admission reserves them")
        pages = self.free[-k:][::-1]
        for page in pages:
            if not can_take(self.page_state[page]):
                raise InvariantViolation("arena_routing", ("page taken while owned", page,
                                                           self.owner_of(page), pool_key,
                                                           block))
        del self.free[-k:]
        for page in pages:
            self.page_state[page], self.owner[page], self.owner_block[page] = \
                PAGE_OWNED, pool_key, block
        self.pages_held[pool_key] += k
        if k > 1:
            self.more_pages[pages[0]] = pages[1:]
        return pages[0]

    def give(self, pool_key, block, page):
        """The pages of the block whose slot is ``page`` are free again: block ``block`` of
        pool ``pool_key`` returned to FREE (or moved).  ``spec.arena.can_give`` refuses a give
        by anyone but a page's owner (a FREE page has none) and nothing changes."""
        pages = self.pages_of(page)
        for p in pages:
            if not can_give(*self.owner_of(p), *pool_key, block):
                raise InvariantViolation("arena_routing", ("page given back by a non-owner", p,
                                                           self.owner_of(p), pool_key, block))
        self.more_pages.pop(page, None)
        for p in pages:
            self.page_state[p], self.owner[p], self.owner_block[p] = PAGE_FREE, None, NO_PAGE
            self.free.append(p)
        self.pages_held[pool_key] -= len(pages)

    def owner_of(self, page):
        """(kind, group, block) owning ``page``; ``NOBODY`` while it is FREE."""
        key = self.owner[page]
        return NOBODY if key is None else (*key, self.owner_block[page])

    # -- capacity across kinds ----------------------------------------------------------------
    def available(self, pools, evictor):
        """Pages an allocation could have now: free pages plus every pool's cached blocks
        eviction can take (Evictor.available counts only those, beside its free blocks)."""
        return self.n_free + sum((evictor.available(pk) - pool.n_free) *
                                 self.pages_per_block(pk) for pk, pool in pools.items())

    def giver(self, pools, evictor):
        """The pool that gives a page back: the one whose own victim is cheapest to recompute
        per page (FLOPs a hit through it saves, the evictor's rule: covered tokens x layers;
        0 for a victim no lookup can reach), the pool holding more pages on a tie; None
        when no pool has a victim."""
        best, best_cost = None, None
        for pk, pool in pools.items():
            b = evictor.victim(pk)
            if b is None:
                continue
            reachable = evictor.index.reachable(ObjRef(pk[0], pk[1], b))
            cost = (pool.recs[b][COVERED] * pool.n_layers / self.pages_per_block(pk)
                    if reachable else 0, -self.pages_held[pk])
            if best_cost is None or cost < best_cost:
                best, best_cost = pk, cost
        return best

    def make_room(self, num_pages, pools, evictor):
        """Until ``num_pages`` pages are free: the ``giver`` pool evicts one victim through its
        own path (Evictor.make_room: its policy, the disk spill on eviction).  Admission
        counted only takeable blocks, so this does not run short."""
        while self.n_free < num_pages:
            pk = self.giver(pools, evictor)
            if pk is None:
                raise AdmissionRefused("arena exhausted", {"arena": (num_pages, self.n_free)})
            evictor.make_room(pk, pools[pk].n_free + 1)

    # -- checks and stats -----------------------------------------------------------------------
    def check(self, pools):
        """Problems (empty list = sound).  The spec's state routing (``spec.arena_system``:
        ``arena_routing``, ``arena_accounting``, ``page_count``), through its per-page and
        per-block rules: a FREE page has no owner and an OWNED one has one, every non-FREE
        block owns exactly its pages (one, or its pool's ``block_pages``) and a FREE block
        none, owned pages == the non-FREE blocks' pages.  And the runtime's own bookkeeping: a
        block's slot names the pages it owns (so no page is held twice), a FREE block holds no
        slot, free pages sit on the free list once, the per-owner counts agree."""
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
                n_held += (rec.st != FREE) * self.pages_per_block(pk)
                if not block_pages_ok(rec.st, len(pages), self.pages_per_block(pk)):
                    bad.append(("block-pages", pk, b, rec.st, pages))
                if rec.st == FREE:
                    if page != NO_PAGE:
                        bad.append(("page-of-free-block", pk, b, page))
                elif page not in pages or sorted(self.pages_of(page)) != sorted(pages):
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


class ArenaPool(Pool):
    """A pool whose block b holds arena page ``phys[b]`` from leaving FREE to returning to
    FREE (``NO_PAGE`` meanwhile); ``num_pages`` spec records; a relocation moves to another
    free page."""

    def __init__(self, kind, group, arena, tensors, abi, ctx, checked=False,
                 on_transition=None):
        self.arena, self.key = arena, (kind, group.name)
        super().__init__(kind, group, arena.num_pages, tensors, abi, ctx, arena.device, checked,
                         on_transition)
        self.phys = [NO_PAGE] * self.n
        self.spare = None                     # no spare slot: relocation takes free pages
        self.k = arena.pages_per_block(self.key)        # pages a block of this pool takes

    def _make_storage(self, tensors, dtype, device):
        return self.arena.views(self.key, tensors, self.n_layers, dtype)

    def alloc(self):
        """A FREE block id, or None when the arena has no pages for it to take."""
        return super().alloc() if self.arena.n_free >= self.k else None

    def alloc_run(self, n):
        """At most as many FREE block ids as the arena has pages for them to take."""
        return super().alloc_run(min(n, self.arena.n_free // self.k))

    def _moved(self, b, old, new):
        super()._moved(b, old, new)
        if old == FREE:
            self.phys[b] = self.arena.take(self.key, b)
        elif new == FREE:
            self.arena.give(self.key, b, self.phys[b])
            self.phys[b] = NO_PAGE

    def _fresh_slot(self, b, st):
        if self.arena.n_free < self.k:
            raise TransitionRefused(self.kind, st, "relocate")
        return self.arena.take(self.key, b)

    def _retire_slot(self, b, slot):
        self.arena.give(self.key, b, slot)

    def _check_slots(self):
        return []                             # pages: Arena.check, over every pool at once

    def check_blocks(self, blocks):
        """Pool.check_blocks, and: a held block's page is owned by this block of this pool, a
        FREE block holds no page."""
        bad, arena = super().check_blocks(blocks), self.arena
        for b in blocks:
            page = self.phys[b]
            if self.recs[b].st == FREE:
                if page != NO_PAGE:
                    bad.append(("page-of-free-block", b, page))
            elif page == NO_PAGE or arena.owner_of(page) != (*self.key, b):
                bad.append(("page-owner", b, page))
        return bad

    def load_records(self, recs):
        raise BadArgument("an arena pool takes no abstract start state", self.key)
