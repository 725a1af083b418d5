"""Snapshots: the exact objects of a checkpoint at a retention point P (per group the window at
P, the compressor and indexer open windows, the open compressed block), written when an
allocation reaches P and captured -- bytes copied from the request's working objects -- by the
commit that ends exactly at P.  A commit that passes P without ending there captures it only
when every object of P is a window (``passable``: rows [first_read(P), P), which the request's
window pages still hold until the commit's slide); otherwise the working objects already hold a
later state and P's objects are released.

Retention (Marconi-style): the branch point (the end of the cached compressed chain a request
extends), with ``CacheManager(forks=)`` the fork (where its prompt parts from the prompts
admitted before it, ``SeenPrefixes``: inside compressed blocks no request has cached; at least
``min_fork`` tokens in), the prompt's last aligned position before its last token (``repeat``:
an identical prompt resumes there), the end of every allocation rounded down to
``resume_every`` (``end``: provisional; superseded by the next end, the last one stays when the
request is freed; an allocation that reaches no new multiple of ``resume_every`` writes none),
and every ``every_n`` tokens.

``resume_every`` is the stride of the engine's own resume points, the granule by default.  An
engine that resumes only at whole blocks (vLLM: its scheduler block) sets its block size: a
decode then captures its end once per block instead of once per granule, and the prompt's
last block boundary before its last token is retained too (``boundary``, vLLM's replay
boundary): a later prompt that shares the prompt's whole blocks and not its partial last one
resumes there.
A snapshot not read by its writer is a cache entry as soon as it is captured, except a
provisional end, which stays protected until superseded or the request is freed.
"""
import heapq

from hybridkv.cache.arena_pool import ArenaPool
from hybridkv.cache.request import Owned, SlotCopy
from hybridkv.cache.subpages import NEVER
from hybridkv.errors import InvariantViolation

SEMANTIC = frozenset({"branch", "fork", "repeat", "boundary"})
RETAINED = SEMANTIC | {"every"}


class Snapshots:
    def __init__(self, layout, pools, index, evictor, subpages, every_n=0, resume_every=None,
                 min_fork=0):
        self.layout, self.pools, self.index, self.evictor = layout, pools, index, evictor
        self.subpages = subpages     # WindowSubPages: a window snapshot's sub-pages
        self.every_n = every_n
        self.resume_every = resume_every or layout.granule    # a multiple of the granule
        self.objectless = layout.objectless      # no checkpoint has an exact object
        # forks at least this many tokens in (CacheManager's forks): one shorter than a block
        # saves less than a block of recompute per hit, for a checkpoint's bytes
        self.min_fork = min_fork
        self.captured_bytes = 0      # bytes copied into snapshots at capture
        self.skipped = 0             # points not written: no room beside their allocation
        self.abandoned = 0           # points written, then given up for another's room
        self.written = {}            # (request id, P) -> (request, held, objects) of a point
        self.reclaimable = {}        # written, not captured: pool key -> what they hold
        self.reclaimable_objects = 0  # ... and how many objects (in transit while WRITING)
        self.copies = []             # SlotCopy of the captures since the manager last took them

    # -- where ------------------------------------------------------------------------------
    def points(self, req, start, end):
        """{P: tags} of the retention points in (start, end]."""
        gran, pts = self.layout.granule, {}
        last = req.prompt_len - 1 if self.objectless else end    # (next_point: none past it)
        if min(end, last) < max(start + 1, gran):     # no P that ``add`` takes fits: a decode
            return pts                                # step of an objectless layout, a no-op

        def add(P, tag):
            if start < P <= min(end, last) and P > 0 and P % gran == 0:
                pts.setdefault(P, set()).add(tag)
        if req.plan.branch < req.prompt_len:
            add(req.plan.branch, "branch")
        if max(req.plan.branch, self.min_fork - 1) < req.shared_tokens < req.prompt_len:
            add(req.shared_tokens, "fork")
        add(end - end % self.resume_every, "end")
        add((req.prompt_len - 1) // gran * gran, "repeat")
        if self.resume_every > gran:
            add((req.prompt_len - 1) // self.resume_every * self.resume_every, "boundary")
        if self.every_n:
            for P in range((start // self.every_n + 1) * self.every_n, end + 1, self.every_n):
                add(P, "every")
        return dict(sorted(pts.items()))

    def next_point(self, req, A):
        """A position at or before the first P > A that ``points(req, A, end)`` can name for
        some end: inside the prompt (the branch, repeat and boundary points lie below
        ``prompt_len``) the next granule; past it the next multiple of ``resume_every`` (the
        provisional end) or of ``every_n``; none (``NEVER``) in a layout whose checkpoints
        have no exact object (full attention: the chain blocks alone are the state, a point
        past the prompt would write and capture nothing).  An allocation from A ending before
        it writes no snapshot (``ObjectWriter.horizon``: a decode step past the prompt
        crosses a granule without the full allocation path)."""
        gran = self.layout.granule
        if A < req.prompt_len:
            return (A // gran + 1) * gran
        if self.objectless:          # no point past the prompt writes or captures anything:
            return NEVER             # a decode step goes the full path only for a new block
        nxt = (A // self.resume_every + 1) * self.resume_every
        if self.every_n:
            nxt = min(nxt, (A // self.every_n + 1) * self.every_n)
        return nxt

    @staticmethod
    def priority(P, tags):
        """Which points an allocation short of room keeps first (smallest first): a point
        kept beyond the request (branch, repeat, boundary), then the provisional end (where
        the request resumes after a preemption, or its next turn), then ``every`` points,
        the latest first."""
        return (0 if tags & SEMANTIC else 1 if "end" in tags else 2, -P)

    def count(self, points):
        """Blocks per pool the exact objects of ``points`` take."""
        need = {}
        for P in points:
            for pk in self.layout.exact_kinds(P):
                need[pk] = need.get(pk, 0) + 1
        return need

    # -- write, capture ----------------------------------------------------------------------
    def write(self, req, points, publish_run):
        """Write the exact objects of every point (WRITING) and publish those whose tokens
        are known (``publish_run(req, exact objects)``, in point order): a lookup may
        meet them unfinished."""
        at_pool = {}                       # pool key -> the points with an object there
        for P in points:
            for pk in self.layout.exact_kinds(P):
                at_pool.setdefault(pk, []).append(P)
        made = {}                          # (pool key, P) -> its object, one run per pool
        for pk, Ps in at_pool.items():
            _, objs = Owned.write_run(self.pools[pk], Ps)
            if len(objs) != len(Ps):
                raise InvariantViolation("admission", ("no block for a snapshot", pk, Ps))
            made.update(zip(((pk, P) for P in Ps), objs))
        written = []
        for P, tags in points.items():
            objs = [made[(pk, P)] for pk in self.layout.exact_kinds(P)]
            req.snapshots[P] = objs
            req.snapshot_tags[P] = set(tags)
            req.to_publish[P] = len(objs)
            req.pending_points.append(P)
            written.append((P, objs))
        self.subpages.fill_snapshots(written)
        publish_run(req, [o for _, objs in written for o in objs])
        for P, objs in written:
            self._held(req, P, objs)

    def _room(self, objs):
        """pool key -> what ``objs`` hold: pages in arena mode, else blocks."""
        held = {}
        for o in objs:
            pk = (o.ref.kind, o.ref.group)
            pool = self.pools[pk]
            held[pk] = held.get(pk, 0) + (pool.pages_held_by(o.ref.block)
                                          if isinstance(pool, ArenaPool) else 1)
        return held

    def _held(self, req, P, objs):
        """Point P's objects are written: what they hold joins the reclaimable room until a
        commit captures or rejects them."""
        held = self._room(objs)
        for pk, n in held.items():
            self.reclaimable[pk] = self.reclaimable.get(pk, 0) + n
        self.reclaimable_objects += len(objs)
        self.written[(req.request_id, P)] = (req, held, len(objs))

    def _resolved(self, req, P):
        """Point P was captured or rejected: its room is no longer reclaimable."""
        entry = self.written.pop((req.request_id, P), None)
        if entry is not None:
            for pk, n in entry[1].items():
                self.reclaimable[pk] -= n
            self.reclaimable_objects -= entry[2]

    def capture(self, req, Ps):
        """The commit ended at the last of points ``Ps`` (ascending) and passed the others
        (``passable``): copy the working state into their objects, seal them (one run per
        pool: ``Pool.fire_run``), and settle each in order."""
        sealed = {}                        # pool key -> the blocks to fill and seal
        for P in Ps:
            self._resolved(req, P)
            for o in req.snapshots[P]:
                pool = self.pools[(o.ref.kind, o.ref.group)]
                g = self.layout.group(o.ref.group)
                work, b, filed = req.work[g.name], o.ref.block, len(self.copies)
                if o.ref.kind == "swa":
                    self._window(pool, b, work, P, g)
                elif o.ref.kind == "tail":
                    self._copy(pool, b, work.tail.ref.block)
                elif o.ref.kind == "comp":
                    self._copy(pool, b, req.blocks[("comp", g.name)][P // g.block_size])
                else:
                    self._copy(pool, b, work.itail.ref.block, "tail")
                    if P % g.block_size:
                        self._copy(pool, b, req.blocks[("idx", g.name)][P // g.block_size],
                                   "keys")
                if pool.recs.value(b, "pub"):
                    sealed.setdefault((pool.kind, pool.group), []).append(b)
                else:
                    self.evictor.drop(o.ref, "reject")    # its key is another copy's: never kept
                    del self.copies[filed:]               # nobody reads what it got
        for pk, blocks in sealed.items():
            self.pools[pk].fire_run(blocks, "fill")
            self.pools[pk].fire_run(blocks, "seal")
        for P in Ps:
            req.snapshots[P] = [o for o in req.snapshots[P] if o.live(self.pools)]
            req.sealed_points.append(P)
            self.settle(req, P)

    def passable(self, req, P):
        """A commit ending past P can still capture it: each of P's objects is a window whose
        rows [first_read(P), P) the request's window pages hold now (a tail, an open
        compressed or indexer block holds the state at the commit's end, not at P)."""
        if not self.layout.windows_only(P):
            return False
        for o in req.snapshots.get(P, ()):
            g = self.layout.group(o.ref.group)
            work, lo = req.work[g.name], g.first_read(P)
            if lo < P and not (work.first_page <= lo // g.window and
                               (P - 1) // g.window < work.first_page + len(work.pages)):
                return False
        return True

    def _window(self, pool, b, work, P, g):
        """Rows [first_read(P), P) in ring order (row = position mod W) from the window pages
        (none: P starts a chunk)."""
        W, lo = g.window, g.first_read(P)
        if lo == P:
            return
        lo_page, hi_page, cut = lo // W, (P - 1) // W, P % W
        page = lambda j: work.pages[j - work.first_page].ref.block     # noqa: E731
        if lo_page == hi_page:
            self._copy(pool, b, page(lo_page))
            return
        for src, lo, hi in ((page(hi_page), 0, cut), (page(lo_page), cut, W)):
            self.captured_bytes += pool.copy_rows(b, src, "kv", lo, hi)
            self._file(pool, src, b, lo, hi, "kv")

    def _copy(self, pool, dst, src, tensor=""):
        """Block src's rows into block dst (``tensor`` only, or every one), filed as slots."""
        self.captured_bytes += pool.copy_tensor(dst, src, tensor) if tensor else \
            pool.copy(dst, src)
        self._file(pool, src, dst, 0, None, tensor)

    def _file(self, pool, src, dst, row_start, row_end, tensor):
        """File the copy of block src's rows into block dst for the engine's worker (with the
        blocks' arena pages now, where a block spans several: ``SlotCopy``)."""
        pages = (tuple(pool.sub_pages(src)), tuple(pool.sub_pages(dst))) \
            if pool.pages_per_block > 1 else ()
        self.copies.append(SlotCopy(pool.kind, pool.group, pool.slot(src), pool.slot(dst),
                                    row_start, row_end, tensor, *pages))

    # -- lifecycle -----------------------------------------------------------------------------
    def settle(self, req, P):
        """After capturing P: retain it if it is more than a provisional end; release the
        provisional ends it supersedes."""
        if req.snapshot_tags[P] & RETAINED:
            self.retain(req, P)
        # Every settle releases the provisional end before it, so at most one exists: the
        # point sealed just before P (O(1) per capture, however long the request runs).
        if len(req.sealed_points) >= 2:
            Q = req.sealed_points[-2]
            if Q < P and req.snapshot_tags[Q] == {"end"}:
                self.release(req, Q)

    @staticmethod
    def _tags(req, P):
        """Policy tags of P's objects: why P was retained, then the request's class."""
        return ("+".join(sorted(req.snapshot_tags.get(P, ()))), req.hint)

    def retain(self, req, P):
        for o in req.snapshots.get(P, ()):
            if o.live(self.pools) and self.index.published(o.ref.kind, o.ref.group, o.ref.block):
                self.evictor.admit(o.ref, P, True, self._tags(req, P))

    def release(self, req, P):
        """Give back P's objects: dropped, or, when another request has pinned one (it hit
        this snapshot), left to the policy."""
        for o in req.snapshots.pop(P, ()):
            if not o.live(self.pools):
                continue
            rec = self.pools[(o.ref.kind, o.ref.group)].recs[o.ref.block]
            if rec.pins:
                self.evictor.admit(o.ref, P, True, self._tags(req, P))
            else:
                self.evictor.drop(o.ref)
        req.snapshot_tags.pop(P, None)
        if req.sealed_points and req.sealed_points[-1] == P:
            req.sealed_points.pop()
        elif len(req.sealed_points) >= 2 and req.sealed_points[-2] == P:
            del req.sealed_points[-2]
        else:
            req.sealed_points.remove(P)

    def pending(self):
        """Every written, not yet captured point, in the order to abandon them (the least
        worth keeping first, ``priority``): (request, P)."""
        order = sorted(self.written, reverse=True, key=lambda rp: self.priority(
            rp[1], self.written[rp][0].snapshot_tags.get(rp[1], set())))
        return [(self.written[rp][0], rp[1]) for rp in order]

    def check(self, requests):
        """Problems (empty list = sound): the reclaimable room is what the requests' pending
        points hold."""
        objs, bad = [], []
        for req in requests:
            for P in req.pending_points:
                for o in req.snapshots.get(P, ()):
                    if not o.live(self.pools):
                        bad.append(("pending-dead", req.request_id, P, o.ref))
                    objs.append(o)
        held, objects = self._room(objs), len(objs)
        if {pk: n for pk, n in self.reclaimable.items() if n} != held or \
                objects != self.reclaimable_objects:
            bad.append(("reclaimable", self.reclaimable, held, self.reclaimable_objects, objects))
        return bad

    def abandon(self, req, P):
        """A written point no commit captured yet is given up (its allocation's room is
        wanted): its objects are dropped, the commit that reaches P passes it, and the ones
        waiting for their tokens to be published are forgotten (a dropped block may be
        written again, at the same version, by the allocation that wanted the room)."""
        gone = set(req.snapshots.get(P, ()))
        self.reject(req, P)
        req.pending_points.remove(P)
        if any(entry[-1] in gone for entry in req.unpublished):
            req.unpublished = [entry for entry in req.unpublished if entry[-1] not in gone]
            heapq.heapify(req.unpublished)
        self.abandoned += 1

    def reject(self, req, P):
        """P was passed or abandoned before capture: its objects never become readable."""
        self._resolved(req, P)
        for o in req.snapshots.pop(P, ()):
            self.evictor.drop(o.ref, "reject")
        req.snapshot_tags.pop(P, None)
        req.to_publish.pop(P, None)

    def finish(self, req):
        """The request is freed: pending points are rejected, the last provisional end is
        retained."""
        for P in list(req.pending_points):
            self.reject(req, P)
        req.pending_points.clear()
        if req.sealed_points:
            self.retain(req, req.sealed_points[-1])
        req.snapshots.clear()
        req.sealed_points.clear()
