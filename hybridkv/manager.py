"""CacheManager: lookup -> funnel -> plan -> pin -> launch, allocation, commit, drafts, free.

Contract (DESIGN §6):
  lookup(request_id, token_ids, salt=b"") -> HitPlan     reads only; registers the request
  pin(request_id) / unpin(request_id)                   take / give back the plan's objects
  begin_read(request_id)                                TOCTOU re-check (spec can_read_pinned)
  allocate(request_id, num_new_tokens, num_draft_tokens=0) -> Allocation   all or nothing
  commit(request_id, num_tokens, token_ids=None)        seal what is complete, publish it
  accept_drafts(request_id, token_ids) / reject_drafts(request_id)
  free(request_id); check_invariants(); stats(); metrics_text()
  prefetch(plan_or_request_id) / wait_loads(timeout) / spill_all()   with disk=DiskTier(...)
Every public call holds one re-entrant lock (the only lock: pools, index and policies are
touched under it alone).  Bad input raises a named error from hybridkv.errors and changes
nothing; AdmissionRefused changes nothing.  ``checked=True`` shadows every block with a
python-statemachine instance and asserts the invariants after every public call on the state
the call touched, with a full sweep every ``check_every`` calls (hybridkv.checked).
"""
import threading

from hybridkv import alloc as A
from hybridkv.errors import (BadArgument, BadSalt, BadTokens, DraftsPending, RequestBusy,
                             UnknownRequest)
from hybridkv.calls import locked as _locked
from hybridkv.index import PrefixIndex, extend_chain, root_key
from hybridkv.lookup import HitPlan, run_funnel  # noqa: F401  (HitPlan: public)
from hybridkv.metrics import Metrics
from hybridkv.policy import ValuePolicy
from hybridkv.pools import NO_LIMIT, GroupCtx, Pool
from hybridkv.reqstate import Allocation, ReqState, _count  # noqa: F401  (Allocation: public)
from hybridkv.spill import DiskLink
from spec.state import HELD, LOOKED


class CacheManager:
    def __init__(self, layout, num_blocks=64, device="cpu", disk=None, checked=False,
                 policy_factory=ValuePolicy, every_n=0, cap=None, max_ver=NO_LIMIT,
                 max_ep=NO_LIMIT, max_iv=NO_LIMIT, vocab=None, metrics=None,
                 spill_kinds=("comp", "tail", "swa", "idx"), spill_on_evict=True, check_every=64):
        self.layout, self.device, self.disk, self.checked = layout, device, disk, checked
        self.check_every = check_every     # checked mode: a full sweep every N calls
        self.vocab = vocab or layout.vocab
        self.every_n, self.max_iv, self.miv, self.clock = every_n, max_iv, 0, 0
        self.metrics = metrics or Metrics()
        self.ctx = {g.name: GroupCtx(g, max_ver, max_ep) for g in layout.groups}
        sizes = num_blocks if isinstance(num_blocks, dict) else \
            {pk: num_blocks for pk in layout.pool_keys()}
        self.pools = {}
        for kind, gname in layout.pool_keys():
            g = layout.group(gname)
            self.pools[(kind, gname)] = Pool(kind, g, sizes.get((kind, gname)),
                                             layout.block_shape(kind, g), layout.abi(kind, g),
                                             self.ctx[gname], device, checked,
                                             self.metrics.transition)
        self.cap = cap if cap is not None else sum(p.n for p in self.pools.values())
        self.index = PrefixIndex(layout)
        self.policies = {pk: policy_factory() for pk in self.pools}
        self.admitted = {pk: set() for pk in self.pools}
        self.evictable = {pk: set() for pk in self.pools}
        self.reqs = {}
        self.lock = threading.RLock()
        self.object_driver = None
        self.disk_link = DiskLink(self, disk, spill_kinds, spill_on_evict) \
            if disk is not None else None

    @classmethod
    def for_spec(cls, cfg, checked=False):
        """A manager shaped like the spec's abstract system ``cfg`` (spec.SysConfig): one CSA
        group with an indexer, ``cfg.n_obj`` blocks per kind, the spec's counter bounds and
        admission cap.  Drive it with ``.objects`` (hybridkv.driver.ObjectDriver)."""
        from hybridkv.layout import LayerGroup, ModelLayout
        lay = ModelLayout([LayerGroup("g", "csa", (0,), cfg.ratio, cfg.window, cfg.ratio,
                                      cfg.overlap, 1, 1)], name="spec")
        mgr = cls(lay, num_blocks=cfg.n_obj, checked=checked, cap=cfg.cap,
                  max_ver=cfg.max_ver, max_ep=cfg.max_ep, max_iv=cfg.max_iv)
        for cx in mgr.ctx.values():
            cx.kabi = cfg.kabi
            cx.blocks = getattr(cfg, "blocks", cx.blocks)
        mgr.spec_cfg = cfg
        return mgr

    # -- input checks ---------------------------------------------------------------------------
    def _req(self, rid):
        try:
            return self.reqs[rid]
        except (KeyError, TypeError):
            raise UnknownRequest("unknown request", rid) from None

    def _tokens(self, token_ids):
        if hasattr(token_ids, "tolist") and not isinstance(token_ids, (list, tuple)):
            token_ids = token_ids.tolist()
        if not isinstance(token_ids, (list, tuple)):
            raise BadTokens("token_ids must be a sequence of ints", type(token_ids).__name__)
        for i, t in enumerate(token_ids):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0 or \
                    (self.vocab is not None and t >= self.vocab):
                raise BadTokens("token out of range", (i, t))
        return list(token_ids)

    def disk_transit(self):
        """Disk objects in transit (object driver's + this manager's spills and loads)."""
        d, link = self.object_driver, self.disk_link
        return (d.disk_transit() if d is not None else 0) + \
            (len(link.loads) + link.spilling if link is not None else 0)

    # -- lookup / pin / launch ----------------------------------------------------------------
    @_locked
    def lookup(self, request_id, token_ids, salt=b""):
        if not isinstance(salt, bytes):
            raise BadSalt("salt must be bytes", type(salt).__name__)
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            raise BadArgument("request_id must be a str or int", request_id)
        tokens = self._tokens(token_ids)
        if not tokens:
            raise BadTokens("a lookup needs at least one token", (0, None))
        old = self.reqs.get(request_id)
        if old is not None and old.phase != LOOKED:
            raise RequestBusy("request already holds cache state", request_id)
        if self.disk_link is not None:
            self.disk_link.reap()          # finish loads, start queued ones (prefetch)
        root = root_key(self.layout, salt)
        keys = extend_chain([], root, tokens, self.layout.granule)
        plan = run_funnel(self, keys, len(tokens))
        self.reqs[request_id] = ReqState(request_id, salt, root, tokens, keys, plan)
        self.metrics.lookup(plan)
        return plan

    def _refresh_plan(self, req):
        """Re-run the funnel if any object of the plan changed since lookup (another
        request's eviction); the sizing of an allocation must use the current plan."""
        pools = self.pools
        for r in req.plan.reads:
            pool = pools[(r.ref.kind, r.ref.group)]
            rec = pool.recs[r.ref.block]
            if (rec.ver, rec.ep) != (r.ver, r.ep) or pool.target(r.ref.block, "pin") is None:
                req.plan = run_funnel(self, req.keys, len(req.tokens))
                break
        return req.plan

    def _take_plan(self, req):
        """Pin the plan's objects (re-running the funnel if anything changed since lookup)."""
        plan = self._refresh_plan(req)
        pools = self.pools
        self.clock += 1
        for r in plan.reads:
            A.make_ineligible(self, r.ref)
            pool = pools[(r.ref.kind, r.ref.group)]
            pool.fire(r.ref.block, "pin")
            pk = (r.ref.kind, r.ref.group)
            if r.ref.block in self.admitted[pk]:
                self.policies[pk].access(r.ref.block, self.clock)
            if r.ref.kind in ("comp", "idx") and r.at % self.layout.group(r.ref.group).block_size:
                bs = self.layout.group(r.ref.group).block_size
                req.cow[(r.ref.kind, r.ref.group, r.at - r.at % bs + bs)] = r.ref
        req.reads = list(plan.reads)
        req.L = req.A = plan.reuse_tokens
        req.branch = plan.branch
        req.phase = HELD

    # -- allocation --------------------------------------------------------------------------
    @_locked
    def allocate(self, request_id, num_new_tokens, num_draft_tokens=0):
        req = self._req(request_id)
        _count("num_new_tokens", num_new_tokens)
        _count("num_draft_tokens", num_draft_tokens)
        if req.D:
            raise DraftsPending("accept or reject the pending drafts first", req.D)
        first = req.phase == LOOKED
        start = self._refresh_plan(req).reuse_tokens if first else req.A
        if first:
            saved = req.branch
            req.branch = req.plan.branch
        end, dend = start + num_new_tokens, start + num_new_tokens + num_draft_tokens
        tags_before = {P: set(t) for P, t in req.tags.items()}
        pts = A.snapshot_points(self, req, start, end)
        work = frozenset((k, g, w.block_end) for (k, g), w in req.work.items())
        need = A.blocks_needed(self.layout, start, end, pts, reuse_work=work)
        if num_draft_tokens:
            for pk, k in A.blocks_needed(self.layout, start, end, (), dend).items():
                need[pk] = need.get(pk, 0) + k
        try:
            A.admission(self, need, protect=[r.ref for r in req.plan.reads] if first else ())
        except Exception:
            req.tags = tags_before
            if first:
                req.branch = saved
            raise
        if first:
            self._take_plan(req)
            start = req.A
        for pk, k in need.items():
            A.make_room(self, pk, k)
        A.write_objects(self, req, start, end, pts)
        for P in pts:
            req.snap_count[P] = sum(1 for w in req.own if w.exact and w.p == P)
        req.points += [P for P in pts if P not in req.points]
        if num_draft_tokens:
            req.drafts = A.write_objects(self, req, start, end, (), dend)
            req.D = num_draft_tokens
        req.A = end
        A.publish(self, req)
        return self._tables(req, start, end, dend)

    def _tables(self, req, start, end, dend):
        tables = {}
        for r in list(req.reads) + [w.ref for w in req.own + req.drafts]:
            ref = r.ref if hasattr(r, "at") else r
            tables.setdefault((ref.kind, ref.group), []).append(ref.block)
        return Allocation(start, end, dend, {k: tuple(v) for k, v in tables.items()})

    from hybridkv.commit import _extend_tokens, commit   # noqa: E402  (methods)
    from hybridkv.drafts import accept_drafts, reject_drafts   # noqa: E402
    from hybridkv.reads import begin_read, pin, read_ok, set_kernel_version, unpin  # noqa
    from hybridkv.lifecycle import (_release_reads, bump_indexer_version, check_invariants,  # noqa
                                    free, metrics_text, objects, stats)
    from hybridkv.lifecycle import cancel_loads, prefetch, spill_all, wait_loads  # noqa
