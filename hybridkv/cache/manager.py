"""CacheManager: the verified cache manager, whose pools are the KV memory the kernels read.

The flow of one request (what an engine does, what each call does here):
  1. ``lookup(rid, tokens, salt)``   hash the prompt's granules, run the funnel: a HitPlan whose
                                     ``reuse_tokens`` H is the only place it may resume
  2. ``allocate(rid, n[, num_draft_tokens])``   the first call pins the plan's objects (a stale
                                     one: StaleRead, nothing changed), copies the snapshots at H
                                     into the request's working objects, then writes every block
                                     positions (H, H + n] need; all or nothing (AdmissionRefused)
  3. ``tables(rid)`` / ``launch_pins(rid, group)`` / ``layer_pools(layer)``   what a kernel
                                     launch reads: block tables of physical slots, the pins it
                                     re-checks right before it runs (spec can_read_pinned), the
                                     pool tensors; ``begin_read(rid)`` re-checks all of them
  4. ``commit(rid, n, token_ids)``   positions computed: publish, seal, capture snapshots
  5. ``free(rid)``                   working objects released, pins given back, what is
                                     published stays cached for the next request
Drafts: ``allocate(..., num_draft_tokens=k)`` then ``accept_drafts`` / ``reject_drafts``.
Every public call holds one re-entrant lock and never does blocking I/O under it.  Bad input
raises a named error from hybridkv.errors and changes nothing; so does AdmissionRefused.
``num_pages=N`` (instead of ``num_blocks``) draws every pool's blocks from one arena of N equal
pages (hybridkv.cache.arena): block tables hold arena page ids, one id space for every kind;
``block_pages`` gives a pool's blocks k pages each (``slot_pages`` lists them).
``forks=True`` also retains a checkpoint where a prompt parts from the prompts admitted before
it, at least the layout's largest block in (``forks=N``: at least N tokens in;
hybridkv.cache.branches): the next prompt of that family resumes there.
``events=True`` records a CacheEvent for every block filed in / taken out of the prefix index
(``take_events`` drains them: an engine's KV events).
``checked=True`` shadows every block with a python-statemachine instance and asserts the
invariants after every public call (hybridkv.cache.checked).
"""
import contextlib
import gc
import threading

from hybridkv.cache.admission import Admission
from hybridkv.cache.arena import Arena
from hybridkv.cache.arena_pool import ArenaPool
from hybridkv.cache.branches import SeenPrefixes
from hybridkv.cache.checked import Checker, locked
from hybridkv.cache.eviction import Evictor
from hybridkv.cache.funnel import HitPlan, Read, run_funnel
from hybridkv.cache.index import PrefixIndex, extend_chain, root_key
from hybridkv.cache.pool import ObjRef, Pool
from hybridkv.cache.reads import NO_READS
from hybridkv.cache.tables import NO_LIMIT, GroupCtx
from hybridkv.cache.request import (Allocation, Request, check_count, check_timeout,
                                   check_tokens, lookup_tokens)
from hybridkv.cache.snapshots import Snapshots
from hybridkv.cache.subpages import WindowSubPages, merged
from hybridkv.cache.tables import TransitionRefused
from hybridkv.cache.writer import ObjectWriter
from hybridkv.errors import (AdmissionRefused, BadArgument, BadSalt, BadTokens,
                             CommitPastAllocation,
                             DraftsPending, LayoutError, Refused, RequestBusy, StaleRead,
                             UnknownRequest)
from hybridkv.layout import ModelLayout
from hybridkv.metrics import Metrics
from hybridkv.policy import ValuePolicy
from spec.common import FREE, LOADING, PINNED, READY, STALE, WRITING
from spec.funnel import PinCheck, can_bump_indexer, can_read_pinned
from spec.state import HELD, LOOKED, RUNNING

STATE_NAMES = {FREE: "free", WRITING: "writing", READY: "ready", PINNED: "pinned",
               LOADING: "loading", STALE: "stale"}


class LivePins:
    """Pins of a request's reads (PoolReads), read from the pool records each time they are
    iterated."""
    __slots__ = ("pools", "runs")

    def __init__(self, pools, runs):
        self.pools, self.runs = pools, runs

    def __iter__(self):
        for run in self.runs:
            recs = self.pools[(run.kind, run.group)].recs
            for b, ver, ep in zip(run.blocks, run.ver, run.ep):
                rec = recs[b]
                yield PinCheck(rec.pins, ver, rec.ver, ep, rec.ep)

    def __len__(self):
        return sum(map(len, self.runs))


@contextlib.contextmanager
def _collector_paused():
    """The garbage collector off while the manager makes its per-block objects (as many as
    every pool's blocks): they all live as long as the manager, and a collection pass while
    they pile up would rescan them over and over (most of the construction's time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _device(device):
    import torch
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise BadArgument(f"device: {e}", device) from None


class CacheManager:
    def __init__(self, layout, num_blocks=None, device="cpu", disk=None, checked=False,
                 policy_factory=ValuePolicy, every_n=0, cap=None, max_ver=NO_LIMIT,
                 max_ep=NO_LIMIT, max_iv=NO_LIMIT, vocab=None, metrics=None,
                 spill_kinds=("comp", "tail", "swa", "idx"), spill_on_evict=True,
                 check_every=64, num_pages=None, events=False, block_pages=None,
                 resume_every=None, forks=False):
        if not isinstance(layout, ModelLayout):
            raise LayoutError("layout must be a hybridkv.ModelLayout", layout)
        if num_pages is not None:
            if num_blocks is not None:
                raise BadArgument("num_blocks and num_pages exclude each other", num_pages)
            check_count("num_pages", num_pages, 1)
            num_blocks = num_pages            # every pool keeps one record per page
        if block_pages is not None and (num_pages is None or not isinstance(block_pages, dict)
                                        or not set(block_pages) <= set(layout.pool_keys())):
            raise BadArgument("block_pages maps pool keys to pages, in arena mode only",
                              block_pages)
        elif num_blocks is None:
            num_blocks = 64
        sizes = num_blocks if isinstance(num_blocks, dict) else \
            {pk: num_blocks for pk in layout.pool_keys()}
        if set(sizes) != set(layout.pool_keys()):
            raise BadArgument("num_blocks must name every pool", sorted(sizes))
        for pk, n in sizes.items():
            check_count(f"num_blocks[{pk}]", n, 1)
        check_count("every_n", every_n)
        if not isinstance(forks, int) or forks < 0:
            raise BadArgument("forks must be a bool or a number of tokens", forks)
        if every_n % layout.granule:
            raise BadArgument("every_n must be a multiple of the hash granule",
                              (every_n, layout.granule))
        if resume_every is not None:
            check_count("resume_every", resume_every, 1)
            if resume_every % layout.granule:
                raise BadArgument("resume_every must be a multiple of the hash granule",
                                  (resume_every, layout.granule))
        if cap is not None:
            check_count("cap", cap, 1)
        self.layout, self.device, self.checked = layout, _device(device), bool(checked)
        self.vocab = vocab or layout.vocab
        self.max_iv, self.miv = max_iv, 0
        self.metrics = metrics or Metrics()
        self.ctx = {g.name: GroupCtx(g, max_ver, max_ep) for g in layout.groups}
        self.arena = None if num_pages is None else \
            Arena(num_pages, layout.page_nbytes(), self.device, block_pages)
        self.pools = {}
        with _collector_paused():      # one ObjRef and one index entry per block, made here
            for kind, gname in layout.pool_keys():
                g, pk = layout.group(gname), (kind, gname)
                shape = (layout.pool_tensors(kind, g), layout.abi(kind, g), self.ctx[gname])
                self.pools[pk] = Pool(kind, g, sizes[pk], *shape, self.device, self.checked,
                                      self.metrics.transition) if self.arena is None else \
                    ArenaPool(kind, g, self.arena, *shape, self.checked, self.metrics.transition)
            self.index = PrefixIndex(layout, {pk: pool.refs for pk, pool in self.pools.items()})
        self.evictor = Evictor(self.pools, self.index, policy_factory, self.metrics)
        self.admission = Admission(self.pools, self.evictor, cap if cap is not None else
                                   num_pages or sum(sizes.values()), self._transit, self.arena)
        self.subpages = WindowSubPages(layout, self.pools)
        self.snapshots = Snapshots(layout, self.pools, self.index, self.evictor, self.subpages,
                                   every_n, resume_every, max(g.block_size for g in layout.groups)
                                   if forks is True else forks)
        self.writer = ObjectWriter(layout, self.pools, self.index, self.evictor, self.snapshots,
                                   self.subpages)
        self.seen = SeenPrefixes() if forks else None   # where a new prompt forks (branches)
        self.events = [] if events else None           # CacheEvent feed (take_events)
        self.writer.events = self.evictor.events = self.events
        self.requests = {}
        self.num_detached = 0          # handles detach has handed out
        self.spec_cfg = None       # set by for_spec: the abstract configuration it mirrors
        self.holders = []          # other pin holders (e.g. an object-level driver)
        self.lock = threading.RLock()
        self.disk = disk
        self.disk_link = None
        if disk is not None:
            from hybridkv.cache.disklink import DiskLink
            self.disk_link = DiskLink(self, disk, spill_kinds, spill_on_evict)
            self.evictor.on_evict = self.disk_link.on_evict
        self.checker = Checker(self, check_every)

    def _transit(self):
        link = self.disk_link
        return sum(h.disk_transit() for h in self.holders) + \
            (link.in_transit() if link is not None else 0)

    def _request(self, request_id):
        try:
            return self.requests[request_id]
        except (KeyError, TypeError):
            raise UnknownRequest("unknown request", request_id) from None

    def _pool(self, kind, group):
        try:
            return self.pools[(kind, group)]
        except (KeyError, TypeError):
            raise BadArgument("no such pool", (kind, group)) from None

    # -- 1. lookup ------------------------------------------------------------------------------
    @locked
    def lookup(self, request_id, token_ids, salt=b"", hint=""):
        """The HitPlan for ``token_ids`` under tenant ``salt``; registers the request (a
        looked-up request may look up again).  Reads the cache only.  ``hint``: the caller's
        class of the request (e.g. its output-length bucket, known at admission), filed with
        every entry it leaves cached: the eviction policy learns reuse per class."""
        if not isinstance(salt, bytes):
            raise BadSalt("salt must be bytes", type(salt).__name__)
        if not isinstance(hint, str) or len(hint) > 64:
            raise BadArgument("hint must be a str of at most 64 characters", hint)
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            raise BadArgument("request_id must be a str or int", request_id)
        old = self.requests.get(request_id)
        if old is not None and old.phase != LOOKED:
            raise RequestBusy("request already holds cache state", request_id)
        tokens, source = lookup_tokens(token_ids, self.vocab, None if old is None else
                                       (old.token_ids, old.token_source))
        if not tokens:
            raise BadTokens("a lookup needs at least one token", (0, None))
        root = old.root_key if old is not None and old.salt == salt else \
            root_key(self.layout, salt)             # (a waiting request asked again: its own)
        keys = extend_chain(self._known_keys(old, root, tokens, source), root, tokens,
                            self.layout.granule, None if source is None else source.words)
        plan = run_funnel(self.layout, self.index, self.pools, self.ctx, keys, len(tokens),
                          self.disk_link)
        self.requests[request_id] = Request(request_id, salt, root, tokens, keys, plan,
                                            len(tokens), hint, source)
        self.metrics.lookup(plan)
        return plan

    def _known_keys(self, old, root, tokens, source):
        """The chain keys a looked-up request already has for a prefix of ``tokens`` under the
        same root (an engine re-asks a waiting request every step): only the granules past
        them are hashed again.  Empty when there is nothing to reuse.  Two prefixes of one
        ``source`` (CheckedTokens: append-only) agree without comparing them."""
        if old is None or old.root_key != root:
            return []
        n = min(len(old.chain_keys), len(tokens) // self.layout.granule)
        covered = n * self.layout.granule
        if n == 0 or (source is None or old.token_source is not source) and \
                old.token_ids[:covered] != tokens[:covered]:
            return []
        return old.chain_keys if n == len(old.chain_keys) else old.chain_keys[:n]

    # -- 2. pin / allocate ----------------------------------------------------------------------
    def _check_plan(self, req):
        """The plan's objects are still what the funnel checked (pinnable, same version and
        address): else StaleRead naming the first that is not, nothing changed -- the caller
        looks up again.  Pool by pool over the plan's reads: the table once per pool
        (``Pool.accepted``), the versions and epochs compared as lists."""
        for pk, run in req.plan.reads.runs():
            pool, blocks = self.pools[pk], run.blocks
            bad = pool.accepted(blocks, "pin")
            vers, eps = pool.recs.values(blocks, "ver"), pool.recs.values(blocks, "ep")
            if vers != run.ver or eps != run.ep:
                bad = min(bad, next(i for i, (v, e, rv, re) in enumerate(
                    zip(vers, eps, run.ver, run.ep)) if (v, e) != (rv, re)))
            if bad < len(blocks):
                raise StaleRead("planned object changed since lookup",
                                (*pk, blocks[bad]))

    def _take_plan(self, req):
        """Pin the plan's objects (they become the request's reads): one run per pool (a
        refresh reads only its block's own state), block by block if one repeats."""
        runs = [(pk, run.blocks) for pk, run in req.plan.reads.runs()]
        batched = all(len(set(blocks)) == len(blocks) for _, blocks in runs)
        if batched:
            for pk, blocks in runs:
                self.pools[pk].fire_run(blocks, "pin")
        if batched and self.evictor.runs:              # the sets and liveness per pool run
            self.evictor.took_hit(runs)
        else:
            for pk, blocks in runs:
                refs = self.pools[pk].refs
                for b in blocks:
                    if not batched:
                        self.pools[pk].fire(b, "pin")
                    self.evictor.refresh(refs[b])
                    self.evictor.access(refs[b])
        req.reads = req.plan.reads.copy()
        H = req.plan.reuse_tokens
        req.num_computed_tokens = req.num_allocated_tokens = H
        req.phase = HELD

    def _allocate(self, req, end, draft_end):
        first = req.phase == LOOKED
        start = req.plan.reuse_tokens if first else req.num_allocated_tokens
        if first:
            self._check_plan(req)
            if self.seen is not None:
                req.shared_tokens = self.seen.shared(req.chain_keys, len(req.chain_keys)) * \
                    self.layout.granule
        protect = req.plan.reads if first else NO_READS
        held = self.admission.held_back(protect)         # the hit's blocks, counted once
        need = self.writer.blocks_needed(req, end, draft_end)
        subs = self.subpages.count(req, end, draft_end)
        held = self._admit(need, subs, protect, held)   # O(pools): before any per-block work
        points, need, subs = self._points_that_fit(req, start, end, draft_end, need, subs,
                                                   held)
        restored, self.writer.copies = self.writer.restored_bytes, []
        if first:
            self._take_plan(req)
            if self.seen is not None:
                self.seen.remember(req.chain_keys)
        self.admission.make_room(need, subs)
        if first:
            self.writer.begin(req)
        self.writer.write(req, end, draft_end)
        self.snapshots.write(req, points, self.writer.publish_run)
        req.num_allocated_tokens = end
        req.num_draft_tokens = draft_end - end
        self.writer.horizon(req)
        return Allocation(start, end, draft_end, tuple(points), req.tables,
                          self.writer.restored_bytes - restored, tuple(self.writer.copies))

    def _admit(self, need, subs, protect, held):
        """Admission of an allocation's ``need`` and ``subs`` beside the ``protect``ed reads
        (holding back ``held``): refused (AdmissionRefused, nothing changed) unless it fits,
        with pending snapshots abandoned first where that makes it fit.  Returns ``held``
        as it is afterwards."""
        if not self.admission.fits(need, held, subs):
            held = self._abandon_pending(need, protect, held, subs)
            self.admission.check(need, held, subs)       # refuses what still does not fit
        return held

    def _abandon_pending(self, need, protect, held, subs):
        """An allocation short of room takes it from points written and not captured yet
        (``Snapshots.pending``: retention is best effort, a request's progress is not), the
        least worth keeping first, as few as it needs -- only when giving them all up would
        make it fit; otherwise nothing changes and ``check`` refuses.  Returns what the hit's
        blocks hold back afterwards (``held``, counted again after each abandonment: a
        dropped snapshot can leave a chain block it hung from takeable)."""
        snaps = self.snapshots
        if not snaps.written or not self.admission.fits(
                need, held, subs, snaps.reclaimable, snaps.reclaimable_objects):
            return held
        for req, P in snaps.pending():
            snaps.abandon(req, P)
            held = self.admission.held_back(protect)
            if self.admission.fits(need, held, subs):
                break
        return held

    def _points_that_fit(self, req, start, end, draft_end, need, subs, held):
        """The retention points in (start, end] an admitted allocation writes, with its blocks
        and sub-pages counting their snapshots: every point when they fit beside it, else the
        most points that fit in ``Snapshots.priority`` order (the rest are not retained,
        ``stats()["snapshots_skipped"]``).  A snapshot never refuses an allocation that fits
        without it.  One running sum per point, then O(log points) admission checks of O(pools)."""
        points = self.snapshots.points(req, start, end)
        if not points:
            return points, need, subs
        need_all = merged(need, self.snapshots.count(points))     # every point at once
        subs_all = merged(subs, self.subpages.count_snapshots(points))
        if self.admission.fits(need_all, held, subs_all):
            return {P: points[P] for P in sorted(points)}, need_all, subs_all
        order = sorted(points, key=lambda P: self.snapshots.priority(P, points[P]))
        need_upto, subs_upto = [dict(need)], [dict(subs)]   # [k]: with the first k points
        for P in order:
            need_upto.append(merged(need_upto[-1], self.snapshots.count((P,))))
            subs_upto.append(merged(subs_upto[-1], self.subpages.count_snapshots((P,))))

        def sized(k):
            """The first k points of ``order``, the allocation's blocks and sub-pages with
            theirs (what blocks_needed and count_snapshots give for them: sums per point)."""
            return {P: points[P] for P in sorted(order[:k])}, need_upto[k], subs_upto[k]

        def fits(k):
            return not k or self.admission.fits(need_upto[k], held, subs_upto[k])
        lo, hi = 0, len(order)                # fits(lo); fits(hi) False
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        self.snapshots.skipped += len(order) - lo
        return sized(lo)

    @locked
    def pin(self, request_id):
        """Take the plan: pin its objects and copy the snapshots at H into the request's
        working objects (what the first ``allocate`` does implicitly)."""
        req = self._request(request_id)
        if req.phase != LOOKED:
            raise RequestBusy("pin needs a looked-up request", request_id)
        H = req.plan.reuse_tokens
        self._allocate(req, H, H)
        return req.plan

    @locked
    def unpin(self, request_id):
        """Give the plan back (a pinned request that computed nothing): LOOKED again."""
        req = self._request(request_id)
        H = req.plan.reuse_tokens
        if req.phase not in (HELD, RUNNING) or req.num_allocated_tokens != H or \
                req.num_draft_tokens:
            raise RequestBusy("unpin only a pinned request that wrote nothing", request_id)
        self.writer.release(req)
        fresh = Request(req.request_id, req.salt, req.root_key, req.token_ids, req.chain_keys,
                        req.plan, req.prompt_len, req.hint, req.token_source)
        self.requests[request_id] = fresh

    @locked
    def allocate(self, request_id, num_new_tokens, num_draft_tokens=0):
        """Write every block the next ``num_new_tokens`` positions (and ``num_draft_tokens``
        draft positions after them) need; all or nothing.  Returns the Allocation."""
        req = self._request(request_id)
        if type(num_new_tokens) is not int or num_new_tokens < 0:      # (check_count's
            check_count("num_new_tokens", num_new_tokens)              # error; a decode
        if type(num_draft_tokens) is not int or num_draft_tokens < 0:  # step's ints pass
            check_count("num_draft_tokens", num_draft_tokens)          # with no call)
        if req.num_draft_tokens:
            raise DraftsPending("accept or reject the pending drafts first", req.num_draft_tokens)
        start = req.plan.reuse_tokens if req.phase == LOOKED else req.num_allocated_tokens
        end = start + num_new_tokens
        if end <= req.fast_end and not num_draft_tokens:    # held blocks cover it (decode)
            req.num_allocated_tokens = end
            return Allocation(start, end, end, (), req.tables, 0)
        if end <= req.reach_end and not num_draft_tokens:   # window sub-pages alone
            return self._reach(req, start, end)
        return self._allocate(req, end, end + num_draft_tokens)

    def _reach(self, req, start, end):
        """``_allocate`` of a running request's allocation that needs no block and crosses no
        checkpoint (``ObjectWriter.horizon``'s ``reach_end``): the same admission of the
        window sub-pages it reaches (nothing of a hit to hold back, no snapshot to fit), the
        same room made, the writer's sub-page reach (all ``write`` does there)."""
        subs, none = self.subpages.count(req, end, end), {}
        self._admit(none, subs, NO_READS, none)
        self.admission.make_room(none, subs)
        self.writer.reach(req, end)
        req.num_allocated_tokens = end
        req.num_draft_tokens = 0
        self.writer.horizon(req)
        return Allocation(start, end, end, (), req.tables, 0, ())

    # -- 3. what a launch reads --------------------------------------------------------------
    @locked
    def tables(self, request_id):
        """group -> GroupTables: the physical slots the request's launches read (live)."""
        req = self._request(request_id)
        if req.phase == LOOKED:
            raise RequestBusy("tables need an allocated request", request_id)
        return req.tables

    def layer_pools(self, layer):
        """kind -> {tensor name: [slots, rows, dim]} for one model layer (views of its
        group's pool tensors: the memory the kernels read and write)."""
        try:
            gname, j = self.layout.layer_slot[layer]
        except (KeyError, TypeError):
            raise BadArgument("no such layer", layer) from None
        return {kind: {name: pool.layer(name, j) for name in pool.data}
                for (kind, g), pool in self.pools.items() if g == gname}

    def kernel_abi(self, kind, group):
        """The AbiDesc a launch checks the layer views of pool (kind, group) against."""
        return self._pool(kind, group).abi

    def read_ok(self, read):
        """spec can_read_pinned for one Read against the block's current record."""
        if not isinstance(read, Read) or not isinstance(read.ref, ObjRef):
            raise BadArgument("read_ok needs a Read (from a HitPlan or launch)", read)
        pool = self._pool(read.ref.kind, read.ref.group)
        if isinstance(read.ref.block, bool) or not isinstance(read.ref.block, int) or \
                not 0 <= read.ref.block < pool.n:
            raise BadArgument("no such block", tuple(read.ref))
        rec = pool.recs[read.ref.block]
        return can_read_pinned(rec.pins, read.ver, rec.ver, read.ep, rec.ep)

    @locked
    def launch_pins(self, request_id, group=None):
        """The pins of every shared block the request reads (in ``group``): re-iterable, each
        iteration yields a PinCheck with the block's values *as they are then*, so a kernel
        launch that checks them (spec can_read_pinned) checks the state at its launch."""
        req = self._request(request_id)
        if group is not None and group not in self.ctx:
            raise BadArgument("no such group", group)
        return LivePins(self.pools, [run for (_, g), run in req.reads.runs()
                                     if group is None or g == group])

    @locked
    def begin_read(self, request_id):
        """Right before a launch: every pinned object still pinned, same version, same
        address (spec can_read_pinned); raises StaleRead and changes nothing otherwise."""
        req = self._request(request_id)
        if req.phase not in (HELD, RUNNING):
            raise RequestBusy("begin_read needs pinned objects", request_id)
        for (kind, group), run in req.reads.runs():
            recs, blocks = self.pools[(kind, group)].recs, run.blocks
            if not all(map(can_read_pinned, recs.values(blocks, "pins"), run.ver,
                           recs.values(blocks, "ver"), run.ep, recs.values(blocks, "ep"))):
                r = next(r for r in run if not self.read_ok(r))
                raise StaleRead("pinned object changed before the read", tuple(r.ref))
        req.phase = RUNNING

    # -- 4. commit, drafts ----------------------------------------------------------------------
    @locked
    def commit(self, request_id, num_tokens, token_ids=None, settled_tokens=None):
        """Positions [L, L + num_tokens) are computed (their ids in ``token_ids`` when they
        were generated): publish what became known, seal what is complete, capture a
        snapshot when the commit ends on a checkpoint position (or passes one whose
        objects are all windows: ``Snapshots.passable``).  ``settled_tokens``: the
        positions whose queries have run (default: every committed one); the windows slide
        only past those (an engine that commits a step before it runs keeps what the step
        reads).  Returns the captures' copies (SlotCopy, for a worker that moves the bytes)."""
        req = self._request(request_id)
        if type(num_tokens) is not int or num_tokens < 0:
            check_count("num_tokens", num_tokens)
        L = req.num_computed_tokens
        if req.phase == LOOKED or num_tokens > req.num_allocated_tokens - L:
            raise CommitPastAllocation("commit past allocation", (
                num_tokens, req.num_allocated_tokens - L if req.phase != LOOKED else 0))
        if settled_tokens is not None:
            check_count("settled_tokens", settled_tokens)
            if settled_tokens > L + num_tokens:
                raise BadArgument("settled_tokens past the committed positions",
                                  (settled_tokens, L + num_tokens))
        known = req.token_ids
        if token_ids is None:
            if len(known) < L + num_tokens:
                raise BadTokens("commit needs the ids of generated tokens",
                                (len(known), L + num_tokens))
        else:
            extra = check_tokens(token_ids, self.vocab)
            if len(extra) != num_tokens:
                raise BadTokens("token_ids must hold num_tokens ids", (len(extra), num_tokens))
            have = known[L:L + num_tokens]
            if extra[:len(have)] != have:
                raise BadTokens("token_ids disagree with the prompt", (L, have, extra[:len(have)]))
            if len(have) < num_tokens:
                known.extend(extra[len(have):])
                if len(known) // self.layout.granule > len(req.chain_keys):
                    extend_chain(req.chain_keys, req.root_key, known, self.layout.granule)
        req.num_computed_tokens = L + num_tokens
        req.num_settled_tokens = L + num_tokens if settled_tokens is None else settled_tokens
        if L + num_tokens >= req.next_event or \
                (req.unpublished and req.unpublished[0][0] <= len(known)):
            self.writer.commit(req)
            self.writer.horizon(req)
        if not self.snapshots.copies:       # (most commits capture nothing)
            return ()
        copies, self.snapshots.copies = tuple(self.snapshots.copies), []
        return copies

    def _drafts(self, request_id):
        req = self._request(request_id)
        if not req.num_draft_tokens:
            raise RequestBusy("no pending drafts", request_id)
        return req

    @locked
    def accept_drafts(self, request_id, token_ids):
        """The first len(token_ids) drafts were verified.  Every draft accepted: they are
        committed (the draft forward's state is the request's).  Fewer: the accepted positions
        stay allocated, not computed -- the caller recomputes them (the working tails did not
        see the drafts) and commits them, ending a commit on each returned checkpoint."""
        req = self._drafts(request_id)
        tokens = check_tokens(token_ids, self.vocab)
        if len(tokens) > req.num_draft_tokens:
            raise BadArgument("more accepted tokens than drafts",
                              (len(tokens), req.num_draft_tokens))
        if req.num_computed_tokens != req.num_allocated_tokens:
            raise RequestBusy("commit the allocated tokens before accepting drafts",
                              (req.num_computed_tokens, req.num_allocated_tokens))
        whole = len(tokens) == req.num_draft_tokens
        self.writer.settle_drafts(req, len(tokens))
        start = req.num_allocated_tokens
        req.num_allocated_tokens += len(tokens)
        req.num_draft_tokens = 0
        points = self.snapshots.points(req, start, req.num_allocated_tokens)
        try:                                   # the accepted range gets its checkpoints too
            need = self.snapshots.count(points)
            self.admission.check(need)
            self.admission.make_room(need)
            self.snapshots.write(req, points, self.writer.publish_run)
        except AdmissionRefused:
            points = {}
        self.writer.horizon(req)
        if whole:
            self.commit(request_id, len(tokens), tokens)
        return tuple(points)

    @locked
    def reject_drafts(self, request_id):
        """Every draft rejected: its blocks released, the working tails untouched."""
        req = self._drafts(request_id)
        self.writer.settle_drafts(req, 0)
        req.num_draft_tokens = 0
        self.writer.horizon(req)

    # -- 5. free ----------------------------------------------------------------------------
    @locked
    def take_events(self):
        """The CacheEvents since the last call, oldest first (stored: a block a lookup can hit
        now; removed: one it no longer can), then none until more happen; [] without
        ``events=True``."""
        if self.events is None:
            return []
        out = list(self.events)
        self.events.clear()
        return out

    @locked
    def free(self, request_id):
        """Release everything the request holds: working objects rejected, pins given back;
        its published blocks and retained snapshots stay cached."""
        req = self._request(request_id)
        if req.phase != LOOKED:
            self.writer.release(req)
        del self.requests[request_id]

    @locked
    def detach(self, request_id):
        """Keep everything the request holds under a new handle and free its id for reuse,
        for an engine whose in-flight step may still write the request's blocks after it is
        done with the request (vLLM's deferred free): nothing is released, its blocks stay
        held (neither free nor evictable) until ``free(handle)``.  Returns the handle."""
        req = self._request(request_id)
        self.num_detached += 1
        handle = ("detached", self.num_detached)
        req.request_id = handle
        self.requests[handle] = self.requests.pop(request_id)
        return handle

    # -- cache-wide --------------------------------------------------------------------------
    @locked
    def bump_indexer_version(self, sweep=True):
        """New indexer weights, only at a quiescent point (spec funnel.can_bump_indexer: no
        request registered (a looked-up one's plan names old objects), no indexer copy
        loading; queued indexer loads are dropped first).
        Objects of the old version stop covering any H; with ``sweep`` the ones nobody holds
        go back to the free list now (mark_stale + drop_stale), pinned ones when released."""
        if not isinstance(sweep, bool):
            raise BadArgument("sweep must be a bool", sweep)
        busy = len(self.requests) + sum(h.requests_in_flight() for h in self.holders)
        loads = sum(h.indexer_loads() for h in self.holders)
        if self.disk_link is not None:
            loads += self.disk_link.quiesce_indexer()
        if not can_bump_indexer(self.miv, self.max_iv, busy, loads):
            raise Refused("indexer version bump needs a quiescent cache",
                          {"version": self.miv, "requests_in_flight": busy,
                           "indexer_loads": loads})
        self.miv += 1
        for cx in self.ctx.values():
            cx.miv = self.miv
        if sweep:
            self._sweep_stale()

    def _sweep_stale(self):
        for (kind, g), pool in self.pools.items():
            if kind != "idx":
                continue
            pool.on_ready = lambda b, g=g: self._sweep_block(g, b)
            for b, rec in enumerate(pool.recs):     # once per bump: a full pass is fine
                if rec.st != FREE and rec.iv != self.miv:
                    if rec.st in (READY, STALE):
                        self._sweep_block(g, b)
                    else:
                        pool.watch.add(b)

    def _sweep_block(self, g, b):
        pool = self.pools[("idx", g)]
        rec = pool.recs[b]
        if rec.iv == self.miv:
            return
        if rec.st == READY and pool.target(b, "mark_stale") is not None:
            pool.fire(b, "mark_stale")
        if pool.recs.state(b) == STALE and pool.target(b, "drop_stale") is not None:
            self.evictor.drop(ObjRef("idx", g, b), "drop_stale")

    @locked
    def set_kernel_version(self, kind, group, kernel_version):
        """The kernel for pool (kind, group) now expects another ABI; objects stored with the
        old one fail funnel layer 2 until rewritten."""
        pool = self._pool(kind, group)
        check_count("kernel_version", kernel_version)
        pool.abi = self.layout.abi(kind, group, kernel_version)

    @locked
    def relocate(self, kind, group, block):
        """Move a cached, unpinned block to another slot (compaction): its address epoch
        grows, so a reader that checked the old address is refused (spec relocate)."""
        pool = self._pool(kind, group)
        check_count("block", block)
        if block >= pool.n:
            raise BadArgument("no such block", block)
        try:
            pool.relocate(block)
        except TransitionRefused as e:
            raise Refused("relocation refused", (kind, group, block, str(e))) from None

    @locked
    def evict(self, kind, group, block):
        """Evict a cached block now because its bytes are known bad (an engine's KV load into
        it failed), with every chain block below it in its pool: their content was computed
        from it, and their keys stay valid for the same tokens.  Deepest first, each through
        its pool's eviction path (spec ``evict``), never spilled to disk.  All or nothing:
        while any of them is not cached (pinned by a request, being written, ...) Refused
        names it with its state and nothing changes (call again once it is released)."""
        pool = self._pool(kind, group)
        check_count("block", block)
        if block >= pool.n:
            raise BadArgument("no such block", block)
        pk, below, order = (kind, group), [block], []
        while below:                                     # the subtree, parents before children
            b = below.pop()
            order.append(b)
            below += self.index.children_of(ObjRef(kind, group, b))
        for b in order:
            if b not in self.evictor.cached[pk] or (
                    pool.recs.state(b) != STALE and pool.target(b, "evict") is None):
                raise Refused("only a cached block can be evicted",
                              (kind, group, b, STATE_NAMES[pool.recs.state(b)]))
        for b in reversed(order):
            self.evictor.drop(ObjRef(kind, group, b))
            self.metrics.evicted(kind)

    def page_owner(self, page):
        """The ObjRef of the block holding arena page ``page`` (one of its pages), None while
        the page is free (reads only: an engine that names blocks by page, e.g. vLLM's ids)."""
        check_count("page", page)
        if self.arena is None or page >= self.arena.num_pages:
            raise BadArgument("no such arena page", page)
        kind, group, block = self.arena.owner_of(page)
        return None if group is None else ObjRef(kind, group, block)

    def check_invariants(self):
        """Assert every spec invariant on the whole runtime state (hybridkv.cache.checked);
        raises InvariantViolation naming the first that fails."""
        with self.lock:
            self.checker.check_all()

    @locked
    def stats(self):
        pools = {}
        for (kind, g), p in self.pools.items():
            counts = {name: 0 for name in STATE_NAMES.values()}
            for r in p.recs:
                counts[STATE_NAMES[r.st]] += 1
            counts.update(blocks=p.n, evictable=len(self.evictor.cached[(kind, g)]),
                          dead=len(self.evictor.dead[(kind, g)]), block_bytes=p.block_nbytes)
            pools[f"{kind}/{g}"] = counts
        out = {"pools": pools, "requests": len(self.requests),
               "checkpoints": self.index.num_checkpoints(),
               "in_transit": self.admission.in_transit(),
               "cap": self.admission.cap, "indexer_version": self.miv,
               "granule": self.layout.granule,
               "snapshot_bytes_copied": {"restored_on_hit": self.writer.restored_bytes,
                                         "captured": self.snapshots.captured_bytes},
               "snapshots_skipped": self.snapshots.skipped,
               "snapshots_abandoned": self.snapshots.abandoned,
               "kv_bytes_held": self.kv_bytes_held(), **self.metrics.summary()}
        if self.disk_link is not None:
            out["disk"] = self.disk_link.stats()
        if self.arena is not None:
            out["arena"] = self.arena.stats(self.pools)
        return out

    def kv_bytes_held(self):
        """Bytes of every non-free block (what the cache holds right now)."""
        return sum((p.n - p.n_free) * p.block_nbytes for p in self.pools.values())

    def metrics_text(self):
        return self.metrics.prometheus_text()

    # -- disk tier -----------------------------------------------------------------------------
    def _link(self):
        if self.disk_link is None:
            raise BadArgument("this cache has no disk tier", None)
        return self.disk_link

    @locked
    def prefetch(self, plan_or_request_id):
        """Start verified loads of the disk objects a HitPlan reports (``plan.disk``), keyed
        again from the plan's index keys and this cache's salt rules (a forged plan loads
        nothing foreign); returns how many were accepted."""
        link = self._link()
        plan = plan_or_request_id if isinstance(plan_or_request_id, HitPlan) \
            else self._request(plan_or_request_id).plan
        return link.start(plan)

    def wait_loads(self, timeout=10.0):
        """Wait (up to ``timeout`` s in all, never holding the cache lock while waiting) for
        loads in flight and queued; publish the verified ones; returns how many are left."""
        check_timeout("timeout", timeout)
        return self._link().wait(timeout)

    def poll_loads(self):
        """Publish loads that finished, start queued ones; returns how many are left."""
        return self._link().wait(0)

    @locked
    def cancel_loads(self):
        """Cancel queued loads and those in flight; returns how many are still finishing."""
        return self._link().cancel()

    def spill_all(self, timeout=60.0):
        """Spill every READY published object to the disk tier (memory copies stay), e.g.
        before shutdown; returns SpillCounts (written, failed, not_retried, left).  An object
        whose spill failed is not tried again until the tier changes (DiskTier.epoch), so a
        full disk or a full Redis returns after at most one failed write per object."""
        check_timeout("timeout", timeout)
        return self._link().spill_all(timeout)

    # -- sizing ------------------------------------------------------------------------------
    @staticmethod
    def pool_sizes(layout, max_tokens, max_requests, every_n=0):
        """Pool sizes that hold ``max_requests`` requests of ``max_tokens`` each with their
        checkpoints (the counts admission uses)."""
        check_count("max_tokens", max_tokens)
        check_count("max_requests", max_requests)
        probe = CacheManager(layout, num_blocks=1, every_n=every_n)
        probe.lookup("size", [0] * max(1, max_tokens))
        req = probe.requests["size"]
        pts = probe.snapshots.points(req, 0, max_tokens)
        need = probe.writer.blocks_needed(req, max_tokens, max_tokens, pts)
        return {pk: max(1, need.get(pk, 0) * max_requests) for pk in layout.pool_keys()}

    @staticmethod
    def arena_pages(layout, max_tokens, max_requests, every_n=0):
        """Arena pages that hold ``max_requests`` requests of ``max_tokens`` each with their
        checkpoints: every pool's ``pool_sizes`` on one page each."""
        return sum(CacheManager.pool_sizes(layout, max_tokens, max_requests, every_n).values())

    @classmethod
    def for_spec(cls, cfg, checked=False):
        """A manager shaped like the spec's abstract system ``cfg`` (spec.SysConfig): one CSA
        group with an indexer, ``cfg.n_obj`` blocks per kind, the spec's counter bounds and
        admission cap (driven object by object by hybridkv.testing.driver.ObjectDriver)."""
        from hybridkv.layout import LayerGroup
        lay = ModelLayout([LayerGroup("g", "csa", (0,), cfg.ratio, cfg.window, cfg.ratio,
                                      cfg.overlap, 1, 1)], name="spec")
        mgr = cls(lay, num_blocks=cfg.n_obj, checked=checked, cap=cfg.cap,
                  max_ver=cfg.max_ver, max_ep=cfg.max_ep, max_iv=cfg.max_iv)
        for cx in mgr.ctx.values():
            cx.kabi = cfg.kabi
            cx.blocks = getattr(cfg, "blocks", cx.blocks)
        mgr.spec_cfg = cfg
        return mgr

    # -- read-only queries for engine adapters (hybridkv.integrations) -------------------------
    @locked
    def available_blocks(self):
        """pool key -> blocks an allocation could take now (free + evictable + what written,
        not yet captured snapshots hold: an allocation short of room takes theirs), in
        O(pools); in arena mode the pages all of them could take together, the same for
        every pool."""
        room = self.snapshots.reclaimable
        if self.arena is not None:
            return dict.fromkeys(self.pools, self.arena.available(self.pools, self.evictor)
                                 + sum(room.values()))
        return {pk: self.evictor.available(pk) + room.get(pk, 0) for pk in self.pools}

    @locked
    def cached_block(self, kind, group, key, exact=False):
        """The ObjRef of the block filed under chain ``key`` in pool (kind, group) (a chain
        block, or with ``exact`` a snapshot), None when nothing is (reads only: e.g. a
        CacheEvent's key, to name the block an engine reports by another hash)."""
        self._pool(kind, group)
        b = (self.index.exact_block if exact else self.index.chain_block)(kind, group, key)
        return None if b is None else ObjRef(kind, group, b)

    def chain_keys(self, request_id, first=0, stop=None, step=1):
        """The request's chain keys of granules ``first``, ``first + step``, ... below ``stop``
        (the key of granule i names the prefix ending at (i + 1) * granule: what CacheEvents
        and ``cached_block`` name blocks by), as far as its known tokens go; reads only."""
        return self._request(request_id).chain_keys[first:stop:step]

    def known_tokens(self, request_id):
        """How many of the request's token ids hybridkv holds (its prompt from the lookup,
        then what commits added): a commit inside them needs no ids (reads only)."""
        return self._request(request_id).known_tokens

    def filed_keys(self):
        """Every chain key some block (a chain block or a snapshot, any pool) is filed under
        now, as a new set (reads only)."""
        return set().union(*self.index.chain.values(), *self.index.exact.values())

    def slot_pages(self, slot):
        """The arena pages of the block at ``slot`` (a block table entry): ``[slot]``, or all
        k pages of a pool whose blocks take k (``block_pages``)."""
        check_count("slot", slot)
        if self.arena is None:
            return [slot]
        if slot >= self.arena.num_pages:
            raise BadArgument("no such arena page", slot)
        return self.arena.pages_of(slot)

    def slot(self, ref):
        """The physical slot (arena page id) block ``ref`` (an ObjRef, e.g. a HitPlan read's)
        holds now: the id a block table names it by."""
        pool = self._pool(ref.kind, ref.group)
        if isinstance(ref.block, bool) or not isinstance(ref.block, int) or \
                not 0 <= ref.block < pool.n:
            raise BadArgument("no such block", tuple(ref))
        return pool.slot(ref.block)

    def hit_slots(self, plan):
        """(kind, group) -> the slots (``slot``) of ``plan``'s chain reads, in order: the block
        table a resume at ``plan.reuse_tokens`` starts from (its exact objects are restored
        into fresh blocks).  One pass over the reads, pool by pool."""
        if not isinstance(plan, HitPlan):
            raise BadArgument("hit_slots needs a HitPlan", type(plan).__name__)
        out = {}
        for pk, run in plan.reads.runs():
            blocks = run.chain_blocks()
            if blocks:
                out[pk] = list(map(self._pool(*pk).phys.__getitem__, blocks))
        return out

    @locked
    def blocks_needed(self, request_id, num_new_tokens, num_draft_tokens=0):
        """pool key -> new blocks ``allocate(request_id, num_new_tokens, num_draft_tokens)``
        would take now, without the snapshots of retention points (reads only)."""
        return self.writer.blocks_needed(*self._span(request_id, num_new_tokens,
                                                     num_draft_tokens))

    @locked
    def pages_needed(self, request_id, num_new_tokens, num_draft_tokens=0):
        """pool key -> arena pages that allocation would take now (``blocks_needed``'s
        blocks, plus the sub-pages its window positions reach where a pool's blocks span
        several pages), without the snapshots of retention points (reads only)."""
        span = self._span(request_id, num_new_tokens, num_draft_tokens)
        return merged(self.writer.blocks_needed(*span), self.subpages.count(*span))

    def _span(self, request_id, num_new_tokens, num_draft_tokens):
        """(request, end, draft end) of ``allocate(request_id, num_new_tokens,
        num_draft_tokens)``, its arguments checked."""
        req = self._request(request_id)
        check_count("num_new_tokens", num_new_tokens)
        check_count("num_draft_tokens", num_draft_tokens)
        start = req.plan.reuse_tokens if req.phase == LOOKED else req.num_allocated_tokens
        end = start + num_new_tokens
        return req, end, end + num_draft_tokens
