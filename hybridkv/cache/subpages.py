"""Window sub-pages: the arena pages a window group's blocks hold when its pool's blocks span
k pages (``CacheManager(num_pages=N, block_pages={("swa", g): k})``, the vLLM adapter: one
KV block id per block_size tokens, W/block_size of them per window page).

A window page j of W positions (row = position mod W) is k sub-pages of W/k positions: global
sub-block i = p // (W/k) is sub-page i % k of page i // k.

  slot      sub-page 0, taken when the page's block leaves FREE (the block table names it)
  reach     the others, taken as an allocation reaches their positions (the restored window
            [H - W, H) of a hit, then every allocated position)
  slide     given back once no later query reads them: wholly below L - W + 1, the rule the
            page slide uses (``ObjectWriter.slide``), with L the settled positions
  snapshot  a snapshot at P holds the rows [P - W, P): every sub-page once P >= W, else the
            ones under P, taken when it is written

Every take and give is the arena's (``ArenaPool.reach`` / ``give_sub``: the spec's guards).
``count`` and ``count_snapshots`` are the closed-form sizes admission adds to the blocks'
slots; ``reached_end`` and ``next_slide`` bound the writer's bookkeeping-only horizon.  Pools
of one-page blocks (hybridkv's own path) are not touched.
"""
from itertools import islice

from hybridkv.cache.arena import NO_PAGE
from hybridkv.layout import ceil_div
from spec.state import LOOKED

NEVER = 1 << 62


def merged(a, b):
    """Two pool key -> count maps added up."""
    out = dict(a)
    for pk, n in b.items():
        out[pk] = out.get(pk, 0) + n
    return out


def non_slot_subs(lo, hi, k):
    """Global sub-blocks i in [lo, hi) that are not a page's slot (i % k != 0)."""
    if hi <= lo:
        return 0
    return (hi - lo) - (ceil_div(hi, k) - ceil_div(lo, k))


class WindowSubPages:
    def __init__(self, layout, pools):
        self.layout = layout
        self.multi = {}          # group name -> (its swa pool, W, k) where k > 1
        self.groups = {}         # group name -> its LayerGroup (those in multi)
        for g in layout.groups:
            pool = pools.get(("swa", g.name))
            if pool is not None and pool.pages_per_block > 1:
                self.multi[g.name] = (pool, g.window, pool.pages_per_block)
                self.groups[g.name] = g

    # -- sizes ----------------------------------------------------------------------------------
    def count(self, req, end, draft_end):
        """pool key -> sub-pages (beyond the slots ``ObjectWriter.blocks_needed`` counts) an
        allocation up to ``draft_end`` takes for the request's live windows."""
        need, first, H = {}, req.phase == LOOKED, req.plan.reuse_tokens
        for name, (pool, W, k) in self.multi.items():
            if not draft_end:
                continue
            sb = W // k
            lo = self.groups[name].first_read(H) // sb if first else \
                ceil_div(req.num_allocated_tokens, sb)
            n = non_slot_subs(lo, ceil_div(draft_end, sb), k)
            if n:
                need[("swa", name)] = n
        return need

    def snapshot_subs(self, group, P):
        """Sub-pages beyond the slot a window snapshot of ``group`` at P holds: its rows
        [first_read(P), P) in ring order start at row 0 or fill the page."""
        _, W, k = self.multi[group]
        return max(0, ceil_div(P - self.groups[group].first_read(P), W // k) - 1)

    def count_snapshots(self, points):
        """pool key -> sub-pages beyond the slots of the window snapshots at ``points``."""
        need = {}
        for P in points:
            for pk in self.layout.exact_kinds(P):
                if pk[0] == "swa" and pk[1] in self.multi:
                    need[pk] = need.get(pk, 0) + self.snapshot_subs(pk[1], P)
        return need

    # -- takes and gives ------------------------------------------------------------------------
    def reach(self, req, group, lo, hi):
        """The request's window pages of ``group`` take the sub-pages of positions [lo, hi)."""
        if group not in self.multi or hi <= lo:
            return
        pool, W, k = self.multi[group]
        sb = W // k
        first, last = lo // sb, ceil_div(hi, sb)      # global sub-blocks [first, last)
        pages, subs = [], []
        for j in range(first // k, (last - 1) // k + 1):
            s0, s1 = max(first - j * k, 1), min(last - j * k, k)   # page j's, past its slot
            if s0 < s1:
                pages.append(j)
                subs.append(range(s0, s1))
        if pages:
            pool.reach_run(self._blocks(req, group, pages, W), subs)

    def reach_past(self, req, group, end):
        """``reach`` of the positions an allocation adds, [num_allocated_tokens, end), from
        the first sub-block it does not hold yet (``reached_end``: every allocation reached
        the sub-blocks it wrote, and the one holding its last position is still held, as
        ``count`` counts them)."""
        if group in self.multi:
            self.reach(req, group, self.reached_end(group, req.num_allocated_tokens), end)

    @classmethod
    def _blocks(cls, req, group, pages, W):
        """``_block`` of each of ``pages`` (ascending): consecutive regular pages in one pass
        over the request's window pages."""
        work = req.work[group]
        lo, hi = pages[0] - work.first_page, pages[-1] - work.first_page
        if lo >= 0 and hi < len(work.pages) and hi - lo + 1 == len(pages):
            return [o.ref.block for o in islice(work.pages, lo, hi + 1)]
        return [cls._block(req, group, j, W) for j in pages]

    @staticmethod
    def _block(req, group, j, W):
        """The block of the request's window page j (a regular page, or a draft one)."""
        work = req.work[group]
        if 0 <= j - work.first_page < len(work.pages):
            return work.pages[j - work.first_page].ref.block
        return next(o.ref.block for o in req.drafts if o.ref.kind == "swa" and
                    o.ref.group == group and o.at == (j + 1) * W)

    def fill_snapshots(self, written):
        """The window snapshots just written (``written``: (P, objects) per point) take the
        sub-pages their rows need: one run per pool (``ArenaPool.reach_run``)."""
        runs = {}                          # group -> (blocks, their sub-pages)
        for P, objs in written:
            for o in objs:
                if o.ref.kind == "swa" and o.ref.group in self.multi:
                    n = self.snapshot_subs(o.ref.group, P)
                    if n:
                        blocks, subs = runs.setdefault(o.ref.group, ([], []))
                        blocks.append(o.ref.block)
                        subs.append(range(1, 1 + n))
        for group, (blocks, subs) in runs.items():
            self.multi[group][0].reach_run(blocks, subs)

    def slide(self, req, group, L):
        """The first window page gives back its sub-pages wholly below ``oldest_read(L)``."""
        if group not in self.multi:
            return
        pool, W, k = self.multi[group]
        work = req.work[group]
        if not work.pages:
            return
        gone = self.groups[group].oldest_read(L) // (W // k) - work.first_page * k
        if gone < 2:
            return
        b = work.pages[0].ref.block
        held = pool.sub_pages(b)                 # (those given back earlier: nothing to give)
        for s in range(1, min(k, gone)):
            if held[s] != NO_PAGE:
                pool.give_sub(b, s)

    # -- horizon --------------------------------------------------------------------------------
    def reached_end(self, group, allocated):
        """Positions the window's sub-pages cover after allocating up to ``allocated``."""
        if group not in self.multi:
            return NEVER
        _, W, k = self.multi[group]
        return ceil_div(allocated, W // k) * (W // k)

    def next_slide(self, req, group):
        """The settled position at which the first window page's next held sub-page slides."""
        if group not in self.multi:
            return NEVER
        pool, W, k = self.multi[group]
        work = req.work[group]
        if not work.pages:
            return NEVER
        held = pool.sub_pages(work.pages[0].ref.block)
        s = next((s for s in range(1, k) if held[s] != NO_PAGE), None)
        return NEVER if s is None else \
            self.groups[group].slide_at(work.first_page * W + (s + 1) * (W // k))
