"""ObjectWriter: the objects a request writes, and when they are published and sealed.

Per chained group and chain kind (comp, idx) a request's chain block j covers tokens
[j*bs, (j+1)*bs); it is written at p = (j+1)*bs (FREE -> WRITING), filled in place by the
kernels, published under its chain key once the tokens up to its end are known, and sealed
(fill + seal -> READY, then pinned for its writer, which keeps reading it) by the commit that
completes it.  A copy whose key another block already holds stays private (WRITING, never
sealed) and is released with the request.  Per group with a window the request holds window
pages of W positions (page j: positions [j*W, (j+1)*W), row = position mod W), released as the
window slides past them.  Per compressed group a working tail block, per indexer a working
idx block (its ``tail`` tensor) hold the compressors' open windows, rewritten every forward.
Drafts get draft-only blocks past the allocation and draft tail targets (``tables.*_write``),
accepted in place or rejected (the working tails are untouched by a draft forward).

A hit at H (``begin``): the plan's chain blocks are read in place (their slots enter the
tables: zero copy); the snapshots at H are copied into fresh working objects -- the window into
its pages, the tails, the open compressed and indexer blocks (copy on write).
"""
import heapq
from bisect import bisect_right
from itertools import compress, count

from hybridkv.cache.reads import Reads
from hybridkv.cache.pool import ObjRef
from hybridkv.cache.request import CacheEvent, GroupTables, GroupWork, Owned
from hybridkv.cache.unsealed import UnsealedChain
from hybridkv.layout import CHAIN_KINDS, ceil_div
from spec.common import PINNED, WRITING
from spec.state import LOOKED


class ObjectWriter:
    def __init__(self, layout, pools, index, evictor, snapshots, subpages):
        self.layout, self.pools, self.index = layout, pools, index
        self.evictor, self.snapshots = evictor, snapshots
        self.subpages = subpages     # WindowSubPages: a window's sub-pages (k-page blocks)
        self.gran = layout.granule
        self.restored_bytes = 0      # snapshot bytes copied into working objects on hits
        self.copies = []             # those copies of the allocation in progress (Allocation)
        self.events = None           # CacheEvent list when the manager records events
        self._shape = [(g, tuple(k for k in CHAIN_KINDS if k in g.kinds),
                        g.window if "swa" in g.kinds else 0,
                        tuple(k for k in ("tail", "idx") if k in g.kinds)) for g in layout.groups]

    # -- sizing: the one sizing function -------------------------------------------------------
    def blocks_needed(self, req, end, draft_end, points=()):
        """New blocks per pool an allocation of (num_allocated, end] regular and
        (end, draft_end] draft positions takes, with the snapshots at ``points``.  Closed
        form per group: O(pools + points)."""
        need = {}

        def add(pk, n):
            if n > 0:
                need[pk] = need.get(pk, 0) + n
        first = req.phase == LOOKED
        H = req.plan.reuse_tokens
        for g, chains, window, working in self._shape:
            bs, tables = g.block_size, req.tables.get(g.name)
            for kind in chains:
                held = ceil_div(H, bs) if first else len(tables.chain(kind))
                add((kind, g.name), (first and H % bs > 0) + ceil_div(end, bs) - held)
                add((kind, g.name), ceil_div(draft_end, bs) - max(held, ceil_div(end, bs)))
            if window and draft_end:
                nxt = ((H - 1) // window + 1 if H else 0) if first else len(tables.swa)
                restore = nxt - g.first_read(H) // window if first and H else 0
                add(("swa", g.name), restore + (draft_end - 1) // window + 1 - nxt)
            for kind in working:
                add((kind, g.name), first + (draft_end > end))
        for pk, n in self.snapshots.count(points).items():
            add(pk, n)
        return need

    def horizon(self, req):
        """Positions up to which the next allocations and commits are pure bookkeeping:
        ``fast_end`` (an allocation ending there needs no block and crosses no checkpoint),
        ``reach_end`` (one ending there needs no block and crosses no checkpoint, at most
        window sub-pages: ``CacheManager._reach``) and ``next_event`` (the first commit end
        that seals, captures, publishes or slides)."""
        A, blocks, reached, event = req.num_allocated_tokens, 1 << 62, 1 << 62, 1 << 62
        for g, chains, window, _ in self._shape:
            tables = req.tables[g.name]
            for kind in chains:
                blocks = min(blocks, len(tables.chain(kind)) * g.block_size)
            if window:
                work = req.work[g.name]
                blocks = min(blocks, len(tables.swa) * window)
                reached = min(reached, self.subpages.reached_end(g.name, A))
                event = min(event, self.subpages.next_slide(req, g.name))
                if work.pages:
                    event = min(event, g.slide_at((work.first_page + 1) * window))
        for unsealed in req.chain.values():
            if unsealed:
                event = min(event, unsealed.first_at())
        if req.pending_points:
            event = min(event, req.pending_points[0])
        if req.unpublished:
            event = min(event, req.unpublished[0][0])
        req.reach_end = min(blocks, self.snapshots.next_point(req, A) - 1)
        req.fast_end = min(req.reach_end, reached)
        req.next_event = event

    def reach(self, req, end):
        """``write`` of an allocation up to ``end`` within ``reach_end``: no chain block, no
        window page, no draft; the window groups' sub-pages of the new positions."""
        for name in self.subpages.multi:
            self.subpages.reach_past(req, name, end)

    # -- a hit's start ------------------------------------------------------------------------
    def begin(self, req):
        """First allocation: tables from the plan's chain reads (pinned, read in place) and
        fresh working objects, the snapshots at H copied into them."""
        H = req.plan.reuse_tokens
        exact = {(ref.kind, ref.group): ref.block for ref in req.plan.reads.exact_refs()}
        for g in self.layout.groups:
            req.tables[g.name], req.work[g.name] = GroupTables(), GroupWork()
        for pk in self.layout.chain_pools():
            req.blocks[pk], req.chain[pk] = [], UnsealedChain(self.pools[pk].refs)
        for pk, run in req.plan.reads.runs():
            blocks = run.chain_blocks()
            if blocks:
                req.tables[pk[1]].chain(pk[0]).extend(map(self.pools[pk].slot, blocks))
                req.blocks[pk] += blocks
        for g in self.layout.groups:
            tables, work, bs = req.tables[g.name], req.work[g.name], g.block_size
            for kind in CHAIN_KINDS:
                if kind in g.kinds and H % bs:
                    o = self._chain_block(req, g, kind, (H // bs + 1) * bs)
                    self._restore(o, exact[(kind, g.name)])
            if "tail" in g.kinds:
                work.tail = Owned.write(self.pools[("tail", g.name)], H)
                tables.tail = tables.tail_write = self._slot(work.tail)
                if ("tail", g.name) in exact:      # none where the tail is empty at H
                    self._restore(work.tail, exact[("tail", g.name)])
            if "idx" in g.kinds:
                work.itail = Owned.write(self.pools[("idx", g.name)], H)
                tables.itail = tables.itail_write = self._slot(work.itail)
                if H:
                    self._restore(work.itail, exact[("idx", g.name)])
            if "swa" in g.kinds and H:
                W = g.window
                first, last = g.first_read(H) // W, (H - 1) // W   # none: an empty chunk
                tables.swa.extend([-1] * first)
                work.first_page = first
                for j in range(first, last + 1):
                    o = self._page(req, g, j)
                    self._restore(o, exact[("swa", g.name)])
                self.subpages.reach(req, g.name, g.first_read(H), H)

    def _restore(self, o, src):
        pool = self.pools[(o.ref.kind, o.ref.group)]
        self.restored_bytes += pool.copy(o.ref.block, src)
        self.copies.append((o.ref.kind, o.ref.group, pool.slot(src), pool.slot(o.ref.block)))

    def _slot(self, o):
        return self.pools[(o.ref.kind, o.ref.group)].slot(o.ref.block)

    def _chain_block(self, req, g, kind, end, draft=0):
        pk = (kind, g.name)
        o = Owned.write(self.pools[pk], end, draft)
        req.tables[g.name].chain(kind).append(self._slot(o))
        req.blocks[pk].append(o.ref.block)
        if draft:
            req.drafts.append(o)
        else:
            req.chain[pk].append(o)
            self.publish(req, o, False)
        return o

    def _chain_run(self, req, g, kind, ends):
        """Regular chain blocks ending at ``ends``, written as one run and published as
        ``_chain_block`` publishes each."""
        pk = (kind, g.name)
        pool = self.pools[pk]
        blocks, vers = Owned.write_columns(pool, ends)
        req.tables[g.name].chain(kind).extend(map(pool.phys.__getitem__, blocks))
        req.blocks[pk] += blocks
        req.chain[pk].extend(blocks, ends, vers)
        n_known = bisect_right(ends, req.known_tokens)      # (ends ascend)
        filed = self._file_run(req, pk, blocks[:n_known], ends[:n_known], vers)
        for b, end, ver in zip(blocks[n_known:], ends[n_known:], vers[n_known:]):
            self.publish(req, Owned(pool.refs[b], end, ver), False)
        pool.fire_run(filed, "publish")

    def _file_run(self, req, pk, blocks, ends, vers):
        """``_file`` of a request's next chain blocks ``blocks`` of one pool (consecutive:
        ending at ``ends``, one block size apart; written at ``vers``), in order; returns the
        blocks to fire ``publish``.  The leading blocks whose keys nobody holds are filed at
        once (each the next one's parent); from the first taken key on, block by block."""
        kind, gname = pk
        gran, chain_keys = self.gran, req.chain_keys
        step = (ends[1] - ends[0]) // gran if len(ends) > 1 else 1
        keys = chain_keys[ends[0] // gran - 1:ends[-1] // gran:step] if ends else []
        if len(keys) != len(ends):                  # (keys short of the ends: IndexError)
            keys = [chain_keys[end // gran - 1] for end in ends]
        taken = self.index.chain[pk]
        n_free = next(compress(count(), map(taken.__contains__, keys)), len(keys))
        filed = []
        if n_free >= 2:
            head = self.pools[pk].refs[blocks[0]]
            filed = blocks[:n_free]
            parent = self.index.parent_for(kind, gname, chain_keys, ends[0], False)
            self.index.publish_run(kind, gname, filed, keys[:n_free], parent)
            self.evictor.entered_run(head, filed[1:])
            if self.events is not None:
                pkey = None if parent is None else self.index.key_of(kind, gname,
                                                                   parent.block)[0]
                self.events.extend(CacheEvent.stored_chain(kind, gname, keys[:n_free], ends,
                                                           pkey, req.request_id))
            if pk != self.index.ends_pool:    # (whose blocks record their own ends)
                self._record_ends(req, pk, filed, keys[:n_free], ends[:n_free])
        else:
            n_free = 0
        refs = self.pools[pk].refs
        return filed + [b for b, end, ver in zip(blocks[n_free:], ends[n_free:], vers[n_free:])
                        if self._file(req, Owned(refs[b], end, ver), False)]

    def _record_ends(self, req, pk, blocks, keys, ends):
        """The checkpoint records at the ends of chain blocks just published in a row (those
        needing no snapshot): at once where the pool is the layout's one chain pool."""
        if self.layout.chain_pools() == (pk,) and not any(map(self.layout.exact_kinds, ends)):
            self.index.add_block_ends(*pk, blocks, keys, ends)
            return
        for H, key in zip(ends, keys):
            if not self.layout.exact_kinds(H):
                self._record(req, H, key)

    def _page(self, req, g, j, draft=0):
        o = Owned.write(self.pools[("swa", g.name)], (j + 1) * g.window, draft)
        work = req.work[g.name]
        if not work.pages and not draft:
            work.first_page = j
        req.tables[g.name].swa.append(self._slot(o))
        (req.drafts if draft else work.pages).append(o)
        return o

    def _pages(self, req, g, first, stop):
        """``_page`` of window pages first .. stop - 1 (regular ones), as one run (page by
        page with the Evictor's ``runs`` off: the reference)."""
        if stop - first < 2 or not self.evictor.runs:
            for j in range(first, stop):
                self._page(req, g, j)
            return
        pool = self.pools[("swa", g.name)]
        blocks, objs = Owned.write_run(pool, [(j + 1) * g.window for j in range(first, stop)])
        work = req.work[g.name]
        if not work.pages:
            work.first_page = first
        req.tables[g.name].swa.extend(map(pool.slot, blocks))
        work.pages.extend(objs)

    # -- an allocation's objects ----------------------------------------------------------------
    def write(self, req, end, draft_end):
        """Chain blocks and pages up to ``end`` (and drafts up to ``draft_end``) that the
        request does not hold yet; draft tail targets when there are drafts."""
        for g in self.layout.groups:
            tables, work, bs = req.tables[g.name], req.work[g.name], g.block_size
            for kind in CHAIN_KINDS:
                if kind in g.kinds:
                    held = len(tables.chain(kind))
                    ends = list(range((held + 1) * bs, ceil_div(end, bs) * bs + 1, bs))
                    if len(ends) > 1:
                        self._chain_run(req, g, kind, ends)
                    elif ends:                  # one block (a decode's next): no run's setup
                        self._chain_block(req, g, kind, ends[0])
                    for j in range(max(held, ceil_div(end, bs)), ceil_div(draft_end, bs)):
                        self._chain_block(req, g, kind, (j + 1) * bs, draft=1)
            if "swa" in g.kinds:
                W = g.window
                first, regular = len(tables.swa), max(len(tables.swa), ceil_div(end, W))
                self._pages(req, g, first, regular)
                for j in range(regular, ceil_div(draft_end, W)):
                    self._page(req, g, j, draft=1)
                self.subpages.reach_past(req, g.name, draft_end)
            if draft_end > end:
                if "tail" in g.kinds:
                    work.draft_tail = Owned.write(self.pools[("tail", g.name)], end, 1)
                    tables.tail_write = self._slot(work.draft_tail)
                if "idx" in g.kinds:
                    work.draft_itail = Owned.write(self.pools[("idx", g.name)], end, 1)
                    tables.itail_write = self._slot(work.draft_itail)

    # -- publication ------------------------------------------------------------------------
    def publish(self, req, o, exact):
        """Publish ``o`` now if the tokens up to its position are known, else once they are."""
        if o.at <= req.known_tokens:
            self._publish(req, o, exact)
        else:
            req.seq += 1
            heapq.heappush(req.unpublished, (o.at, exact, req.seq, o))

    def publish_run(self, req, objs):
        """``publish`` of each of ``objs`` (exact objects, each filed under its own key and
        none another's parent), in order: each filed as ``publish`` files it, then the
        blocks filed fire ``publish`` as one run per pool (``Pool.fire_run``); filing reads
        the index and the evictor's sets, never another block's record, so the states end as
        the one-by-one calls leave them (``Evictor.runs`` off: those calls)."""
        if not self.evictor.runs:
            for o in objs:
                self.publish(req, o, True)
            return
        filed = {}                                  # pool key -> blocks to fire publish
        for o in objs:
            if o.at > req.known_tokens:
                self.publish(req, o, True)          # later, once its tokens are known
            elif self._file(req, o, True):
                filed.setdefault((o.ref.kind, o.ref.group), []).append(o.ref.block)
        for pk, blocks in filed.items():
            self.pools[pk].fire_run(blocks, "publish")

    def publish_ready(self, req):
        known, heap = req.known_tokens, req.unpublished
        while heap and heap[0][0] <= known:
            at, exact, _, o = heapq.heappop(heap)
            rec = self.pools[(o.ref.kind, o.ref.group)].recs[o.ref.block]
            if o.live(self.pools) and rec.st == WRITING:
                self._publish(req, o, exact)

    def _publish(self, req, o, exact):
        if self._file(req, o, exact):
            self.pools[(o.ref.kind, o.ref.group)].fire(o.ref.block, "publish")

    def _file(self, req, o, exact):
        """File ``o`` in the index (and its checkpoint record once complete); True when the
        key was free, so the block is to fire ``publish``."""
        kind, gname = o.ref.kind, o.ref.group
        key = req.chain_keys[o.at // self.gran - 1]
        parent = self.index.parent_for(kind, gname, req.chain_keys, o.at, exact)
        filed = self.index.publish(o.ref, key, exact, parent)
        if filed:
            self.evictor.entered(o.ref)
            if self.events is not None:
                pkey = None if parent is None else self.index.key_of(kind, gname, parent.block)[0]
                self.events.append(CacheEvent(True, kind, gname, key, pkey, o.at, exact,
                                              req.request_id))
        elif not exact:
            # recomputed past the hit: the cached block holding this key was demanded again
            held = self.index.chain_block(kind, gname, key)
            if held is not None:
                self.evictor.access(ObjRef(kind, gname, held))
        if not exact and not self.layout.exact_kinds(o.at):
            self._record(req, o.at, key)      # a block end needing no snapshot (full layers)
        if exact:
            left = req.to_publish.get(o.at, 0) - 1
            req.to_publish[o.at] = left
            if left == 0:
                self._record(req, o.at, key)
        return filed

    def _record(self, req, H, key):
        """A checkpoint record at H once every chain block it hangs from is published (a
        block end its chain block records files nothing: PrefixIndex.ends_pool)."""
        if self.index.block_end(H):
            return
        anchors = self.index.anchors_at(req.chain_keys, H)
        if anchors is not None:
            self.index.add_checkpoint(H, key, anchors)

    # -- commit ---------------------------------------------------------------------------------
    def commit(self, req):
        """Positions up to ``num_computed_tokens`` are computed: publish what became known,
        seal complete chain blocks, capture the snapshots it ends on or passes where it may
        (``Snapshots.passable``; the others are given up), slide the windows."""
        L = req.num_computed_tokens
        self.publish_ready(req)
        for pk, unsealed in req.chain.items():
            if unsealed and unsealed.first_at() <= L:
                self._seal_run(req, pk, *unsealed.take_upto(L))
        snaps, captured = self.snapshots, []
        while req.pending_points and req.pending_points[0] <= L:
            P = req.pending_points.pop(0)
            if P == L or snaps.passable(req, P):
                captured.append(P)
            else:
                if captured:                       # in order: what it passed first
                    snaps.capture(req, captured)
                    captured = []
                snaps.reject(req, P)
        if captured:
            snaps.capture(req, captured)
        self.slide(req, min(L, req.num_settled_tokens))

    def _seal_run(self, req, pk, blocks, ends, vers):
        """Seal pool ``pk``'s completed chain blocks ``blocks`` (ending at ``ends``, written
        at ``vers``), one run per event: fill + seal + pin."""
        pool = self.pools[pk]
        pubs = pool.recs.values(blocks, "pub")
        if 0 in pubs:                              # another block holds some one's key
            refs = pool.refs
            req.private += [Owned(refs[b], end, ver) for b, end, ver, pub in
                            zip(blocks, ends, vers, pubs) if not pub]
            blocks, ends = ([col[i] for i, pub in enumerate(pubs) if pub]
                            for col in (blocks, ends))
        pool.fire_run(blocks, "fill")
        pool.fire_run(blocks, "seal")
        pool.fire_run(blocks, "pin")               # its writer keeps reading it
        req.reads.add(pool.kind, pool.group, blocks, ends,
                      pool.recs.values(blocks, "ver"), pool.recs.values(blocks, "ep"))

    def slide(self, req, L):
        """Release window pages no later query reads (positions below ``g.oldest_read(L)``:
        L - W + 1, or L's chunk start)."""
        for g in self.layout.groups:
            if "swa" not in g.kinds:
                continue
            work, tables, W = req.work[g.name], req.tables[g.name], g.window
            gone = []
            while work.pages and (work.first_page + 1) * W <= g.oldest_read(L):
                gone.append(work.pages.popleft().ref.block)
                tables.swa[work.first_page] = -1
                work.first_page += 1
            if gone:
                self.evictor.discard_run(("swa", g.name), gone, "reject")
            self.subpages.slide(req, g.name, L)

    # -- drafts ---------------------------------------------------------------------------------
    def settle_drafts(self, req, accepted):
        """The first ``accepted`` of the request's drafts are verified: draft blocks covering
        them become regular (published, sealed as usual); the rest are released.  The draft
        tail targets replace the working tails only when every draft was accepted (a partial
        acceptance is recomputed by the caller from the untouched working tails)."""
        A = req.num_allocated_tokens
        new_end, whole = A + accepted, accepted == req.num_draft_tokens
        keep = []
        for o in req.drafts:
            g = self.layout.group(o.ref.group)
            size = g.window if o.ref.kind == "swa" else g.block_size
            if o.at - size < new_end:
                keep.append(o)
        for o in reversed(req.drafts):
            if o not in keep:
                tables = req.tables[o.ref.group]
                lst = tables.swa if o.ref.kind == "swa" else tables.chain(o.ref.kind)
                lst.pop()
                if o.ref.kind != "swa":
                    req.blocks[(o.ref.kind, o.ref.group)].pop()
                self.evictor.drop(o.ref, "reject")
        for o in keep:
            self.pools[(o.ref.kind, o.ref.group)].fire(o.ref.block, "accept")
            if o.ref.kind == "swa":
                req.work[o.ref.group].pages.append(o)
            else:
                req.chain[(o.ref.kind, o.ref.group)].append(o)
                self.publish(req, o, False)
        req.drafts = []
        for g in self.layout.groups:
            work, tables = req.work[g.name], req.tables[g.name]
            for attr, slot in (("tail", "tail"), ("itail", "itail")):
                d = getattr(work, "draft_" + attr)
                if d is None:
                    continue
                if whole:
                    self.evictor.drop(getattr(work, attr).ref, "reject")
                    self.pools[(d.ref.kind, d.ref.group)].fire(d.ref.block, "accept")
                    setattr(work, attr, d)
                    setattr(tables, slot, getattr(tables, slot + "_write"))
                else:
                    self.evictor.drop(d.ref, "reject")
                    setattr(tables, slot + "_write", getattr(tables, slot))
                setattr(work, "draft_" + attr, None)

    # -- release -----------------------------------------------------------------------------
    def release(self, req):
        """Free: every working object is rejected, every pin given back (what is published
        becomes a cache entry), the snapshots settled (snapshots.finish); the policy counts
        the unsealed chain blocks (Evictor.unkept)."""
        unsealed = {pk: len(chain) for pk, chain in req.chain.items() if chain}
        for o in list(req.working_objects()):
            self.evictor.drop(o.ref, "reject")
        for pk, n in unsealed.items():
            self.evictor.unkept(pk, n)
        self.snapshots.finish(req)
        runs = {pk: (p.blocks[::-1], p.at[::-1], p.exact[::-1])   # tips first: no liveness
                for pk, p in req.reads.runs()}                     # walks up a chain
        if all(len(set(blocks)) == len(blocks) for blocks, _, _ in runs.values()):
            for pk, (blocks, _, _) in runs.items():        # distinct: a run per pool, each
                self.pools[pk].fire_run(blocks, "unpin",   # block's own record only
                                        distinct=True)
            self.evictor.admit_reads(runs, (req.hint,))
        else:
            for pk, (blocks, at, exact) in runs.items():
                pool = self.pools[pk]
                for b, a, e in zip(blocks, at, exact):
                    pool.fire(b, "unpin")
                    if pool.recs.state(b) != PINNED and self.index.published(*pk, b):
                        self.evictor.admit(pool.refs[b], a, e, (req.hint,))
        req.reads, req.drafts, req.private, req.work, req.chain = Reads(), [], [], {}, {}
