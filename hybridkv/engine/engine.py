"""Engine: continuous batching over V4Mini with the CacheManager deciding every reuse.

Contract:
  Engine(model, cache, chunk=8, max_running=4, step_tokens=64, num_draft_tokens=0,
         model_blocks=1024, graph=True)
  generate(prompts, max_new_tokens, salts=None) -> list of generated token lists (greedy);
  ``last_outputs`` then holds a RequestOutput per prompt (schedule, reuse, hits, drafts).

Per request and step the engine drives the manager exactly as an external engine would:
  plan = cache.lookup(rid, tokens, salt)       H = plan.reuse_tokens (the only resume point)
  model state at H  <- the model checkpoint stored under the same chain key (CheckpointStore);
                       none stored: recompute [0, H) (never resume anywhere else)
  cache.allocate(rid, n[, num_draft_tokens=k])  AdmissionRefused -> preempt newest, retry
  cache.begin_read(rid) once, before the first launch (TOCTOU re-check)
  model.forward(chunk)  ->  cache.commit(rid, n, ids)  ->  store.put where a hit can land
  drafts: commit the real token, accept_drafts(accepted) / reject_drafts(); the model state
          is restored from the pre-draft checkpoint and the accepted tokens re-run
  cache.free(rid) when done or preempted
Disk tier (a manager built with disk=DiskTier(...)): before every lookup the store demotes
model state whose manager objects were evicted (its file goes to the tier, see ckpts.py); a plan
that reaches further through disk copies (disk_choice load | wait) is prefetched, the loads
awaited (``load_timeout``) and the prompt looked up again; the model state at the new H then
comes through a verified load of its own file.  Any failed load is a shorter H or a recompute.
``stats()`` counts disk hits, loads and failures, drafts and graph replays.
"""
from collections import Counter

from hybridkv.engine import bugs
from hybridkv.engine.ckpts import CheckpointStore
from hybridkv.engine.drafter import NgramDrafter
from hybridkv.engine.graph import DecodeGraph
from hybridkv.engine.scheduler import CannotSchedule, Request, Scheduler
from hybridkv.engine.speculate import Speculation
from hybridkv.errors import AdmissionRefused, BadArgument, BadSalt, BadTokens, StaleRead
from hybridkv.model.cache import SeqState

BUGS = bugs.BUGS


class Engine(Speculation):
    def __init__(self, model, cache, chunk=8, max_running=4, step_tokens=64,
                 num_draft_tokens=0, drafter=None, model_blocks=1024, graph=True, bug=None,
                 load_timeout=10.0):
        if chunk < 1 or chunk % cache.layout.granule:
            raise BadArgument("chunk must be a positive multiple of the hash granule", chunk)
        if bug not in BUGS:
            raise BadArgument("unknown seeded bug", bug)
        self.model, self.cache, self.chunk, self.bug = model, cache, chunk, bug
        self.mc = model.new_cache(model_blocks)
        self.store = CheckpointStore(cache, model)
        self.load_timeout, self.counts = load_timeout, Counter()
        self.sched = Scheduler(max_running, step_tokens)
        self.graph = DecodeGraph(self.mc) if graph else None
        self.spec_k = num_draft_tokens
        self.drafter = drafter or NgramDrafter(8)     # sliced to spec_k per step
        self._rid = 0
        self.last_outputs = []

    # -- public ---------------------------------------------------------------------------
    def generate(self, prompts, max_new_tokens, salts=None):
        salts = [b""] * len(prompts) if salts is None else list(salts)
        if len(salts) != len(prompts):
            raise BadArgument("one salt per prompt", (len(salts), len(prompts)))
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise BadArgument("max_new_tokens must be an int >= 0", max_new_tokens)
        reqs = []
        for i, (p, s) in enumerate(zip(prompts, salts)):
            if not isinstance(s, bytes):
                raise BadSalt("salt must be bytes", type(s).__name__)
            p = self.cache._tokens(p)
            if not p:
                raise BadTokens("a prompt needs at least one token", (i, None))
            self._rid += 1
            reqs.append(Request(i, f"e{self._rid}", p, s, max_new_tokens))
        for r in reqs:
            if not r.done:
                self.sched.add(r)
        while self.sched.busy():
            for r in list(self.sched.admissible()):
                self._start(r)
            self._step()
        self.store.prune()
        self.last_outputs = [r.result() for r in reqs]
        return [list(r.out) for r in reqs]

    def stats(self):
        """Engine counters: disk (prefetches, verified object loads and failures, hits, model
        checkpoint spills / loads / failed loads, recompute fallbacks), graph, drafts."""
        out = dict(self.counts)
        sc = self.store.counts
        out.update(ckpt_spills=sc["spilled"], ckpt_spill_failed=sc["spill_failed"],
                   ckpt_loads=sc["loaded"], ckpt_load_failures=sc["load_failed"],
                   ckpt_demoted=sc["demoted"], ckpts_in_memory=len(self.store))
        for k in ("disk_prefetches", "disk_obj_loads", "disk_obj_load_failures", "disk_hits",
                  "recompute_fallbacks"):
            out.setdefault(k, 0)
        link = self.cache.disk_link
        out["disk_obj_spills"] = link.counts["spilled"] if link is not None else 0
        if self.graph is not None:
            out.update(graph_captures=self.graph.captures, graph_replays=self.graph.replays,
                       graph_refused=self.graph.refused, graph_cuda=self.graph.cuda)
        return out

    # -- admission / preemption -----------------------------------------------------------
    def _lookup(self, req):
        """(plan, whether verified disk loads made it longer): see the module doc."""
        self.store.sync()
        plan = self.cache.lookup(req.rid, req.seq, req.salt)
        link = self.cache.disk_link
        if link is None or plan.disk_tokens <= plan.reuse_tokens or \
                plan.disk_choice not in ("load", "wait"):
            return plan, False
        before = dict(link.counts)
        self.counts["disk_prefetches"] += 1
        self.cache.prefetch(req.rid)
        self.cache.wait_loads(self.load_timeout)
        self.counts["disk_obj_loads"] += link.counts["load_verified"] - before["load_verified"]
        self.counts["disk_obj_load_failures"] += link.counts["load_miss"] - before["load_miss"]
        again = self.cache.lookup(req.rid, req.seq, req.salt)
        return again, again.reuse_tokens > plan.reuse_tokens

    def _start(self, req):
        seq = req.seq
        plan, via_disk = self._lookup(req)
        req.hits.append(plan)
        H = plan.reuse_tokens
        req.mstart, req.begun = H, False
        lost_ok = False
        if self.bug == "ignore_plan":          # seeded bug: longest stored state, plan or not
            H, lost_ok = bugs.ignore_plan(self, req, plan)
        st = None
        if H:
            e = self.store.get(seq, req.salt, H, lost_ok=lost_ok)
            if e is not None:
                st = SeqState.restore(self.mc, e.ckpt)
                req.schedule = list(e.schedule)
                req.reused += H
                self.counts["disk_hits"] += via_disk
                req.disk_hits += via_disk
            else:
                req.missing_ckpt += 1
                self.counts["recompute_fallbacks"] += 1
        if st is None:
            st, req.schedule = SeqState(self.mc), []
        req.state = st
        self.sched.running.append(req)

    def _preempt(self, req):
        self.cache.free(req.rid)
        req.state.free()
        req.state, req.logits = None, None
        req.preemptions += 1
        self.sched.requeue(req)

    def _finish(self, req):
        self.cache.free(req.rid)
        req.state.free()
        req.state = None
        self.sched.finish(req)

    def _allocate(self, req, n, d=0):
        """Allocation for ``req`` (preempting the newest running requests on refusal);
        None when ``req`` itself was preempted."""
        while True:
            try:
                a = self.cache.allocate(req.rid, n, num_draft_tokens=d)
                break
            except AdmissionRefused:
                v = self.sched.victim()
                if v is req and len(self.sched.running) == 1:
                    raise CannotSchedule("request does not fit an empty cache", req.index)
                self._preempt(v)
                if v is req:
                    return None
        if not req.begun and a.start != req.state.length:
            # the plan was re-run at pin time (its objects changed since lookup): look up again
            self._preempt(req)
            return None
        if not req.begun:
            try:
                self.cache.begin_read(req.rid)
            except StaleRead:
                self._preempt(req)
                return None
            req.begun = True
        return a

    # -- one engine step ------------------------------------------------------------------
    def _step(self):
        budget = self.sched.step_tokens
        for req in list(self.sched.running):
            if budget <= 0:
                break
            if req not in self.sched.running:
                continue
            budget -= self._work(req, budget)
            if req.state is not None and req.done:
                self._finish(req)

    def _work(self, req, budget):
        seq, st = req.seq, req.state
        L = st.length
        todo = len(seq) - L
        if todo == 1 and self.spec_k and L >= req.mstart and len(req.out):
            d = self.drafter.propose(seq)[:min(self.spec_k, req.max_new - len(req.out) - 1)]
            if d:
                return self._speculate(req, d)
        n = max(1, min(todo, self.chunk - L % self.chunk, budget))
        gran = self.cache.layout.granule
        if n > gran and (L + n) % gran:          # end on the granule: the manager's "end"
            n -= (L + n) % gran                  # checkpoint then lands on a chunk boundary
        managed = L >= req.mstart
        if not managed:
            n = min(n, req.mstart - L)
        elif self._allocate(req, n) is None:
            return 0
        toks = seq[L:L + n]
        if n == 1 and self.graph is not None and L >= len(req.prompt):
            logits = self.graph.step(self.model, toks[0], st)
        else:
            logits = self.model.forward(toks, st)
        req.schedule.append((L, L + n))
        req.recomputed += n
        if managed:
            self.cache.commit(req.rid, n, toks)
            self.store.put(seq, req.salt, st, req.schedule)
        if st.length == len(seq):
            req.out.append(int(logits[-1].argmax()))
        return n
