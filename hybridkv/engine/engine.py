"""Engine: continuous batching over V4Mini with the CacheManager deciding every reuse and owning
every byte of KV (one memory: the model reads and writes the manager's blocks).

Contract:
  Engine(model, cache, chunk=8, max_running=4, step_tokens=64, num_draft_tokens=0,
         drafter=None, graph=True, load_timeout=10.0)
  generate(prompts, max_new_tokens, salts=None) -> list of generated token lists (greedy);
  ``last_outputs`` then holds a RequestOutput per prompt (schedule, reuse, hits, drafts, and
  ``error`` for a request that can never fit: it is reported, everything it held released,
  and the rest of the batch runs on).

One request, as the engine drives the manager (the numbered flow of docs/ARCHITECTURE.md):
  1. plan = cache.lookup(rid, tokens, salt)      H = plan.reuse_tokens, the only resume point
     (with a disk tier: a plan that reaches further through disk copies is prefetched, the
     loads awaited, the prompt looked up again)
  2. cache.allocate(rid, n[, num_draft_tokens])  the first one pins the plan and copies the
     snapshots at H into the request's working blocks; AdmissionRefused -> preempt the newest
     other request and retry; RequestTooLarge -> the request fails alone; StaleRead -> free and
     look up again
  3. cache.begin_read(rid) right before the step, then ONE model.forward over every request of
     the step, each launch given the tables and pins of the blocks it reads (cache.tables,
     cache.launch_pins); a refused launch frees the step's requests, which look up again
  4. cache.commit(rid, n, ids), split at the allocation's checkpoint positions (a snapshot is
     captured by the commit that ends on it); drafts: accept_drafts / reject_drafts
  5. cache.free(rid) when done, preempted or failed
"""
from collections import Counter

from hybridkv.engine.graph import DecodeGraph
from hybridkv.engine.scheduler import CannotSchedule, Request, Scheduler
from hybridkv.engine.speculate import Speculator
from hybridkv.errors import (AdmissionRefused, BadArgument, BadSalt, BadTokens, RequestTooLarge,
                             StaleRead)
from hybridkv.model import SeqWork
from kernels.guards import LaunchRefused


class Engine:
    def __init__(self, model, cache, chunk=8, max_running=4, step_tokens=64,
                 num_draft_tokens=0, drafter=None, graph=True, load_timeout=10.0):
        from hybridkv.cache import CacheManager
        if not isinstance(cache, CacheManager):
            raise BadArgument("cache must be a hybridkv.CacheManager", type(cache).__name__)
        if not callable(getattr(model, "forward", None)) or not hasattr(model, "layout"):
            raise BadArgument("model must be a V4Mini-like model", type(model).__name__)
        if model.layout().groups != cache.layout.groups:
            raise BadArgument("the cache's layout is not the model's (ModelLayout.from_model)",
                              cache.layout)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1 or \
                chunk % cache.layout.granule:
            raise BadArgument("chunk must be a positive multiple of the hash granule", chunk)
        self.model, self.cache, self.chunk = model, cache, chunk
        self.sched = Scheduler(max_running, step_tokens)
        self.spec = Speculator(num_draft_tokens, drafter)
        self.graph = DecodeGraph(cache) if graph else None
        self.load_timeout, self.counts = load_timeout, Counter()
        self._rid = 0
        self.last_outputs = []

    # -- public ---------------------------------------------------------------------------
    def generate(self, prompts, max_new_tokens, salts=None):
        if not isinstance(prompts, (list, tuple)):
            raise BadArgument("prompts must be a list of token lists", type(prompts).__name__)
        salts = [b""] * len(prompts) if salts is None else list(salts)
        if len(salts) != len(prompts):
            raise BadArgument("one salt per prompt", (len(salts), len(prompts)))
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise BadArgument("max_new_tokens must be an int >= 0", max_new_tokens)
        from hybridkv.cache.request import check_tokens
        reqs = []
        for i, (p, s) in enumerate(zip(prompts, salts)):
            if not isinstance(s, bytes):
                raise BadSalt("salt must be bytes", type(s).__name__)
            p = check_tokens(p, self.cache.vocab)
            if not p:
                raise BadTokens("a prompt needs at least one token", (i, None))
            self._rid += 1
            reqs.append(Request(i, f"e{self._rid}", p, s, max_new_tokens))
        for r in reqs:
            if not r.done:
                self.sched.add(r)
        while self.sched.busy():
            while (r := self.sched.admit()) is not None:
                self._start(r)
            self._step()
        self.last_outputs = [r.result() for r in reqs]
        return [list(r.out) for r in reqs]

    def stats(self):
        """Engine counters: disk (prefetches, loads, hits), drafts, replans, graph."""
        out = dict(self.counts)
        for k in ("disk_prefetches", "disk_obj_loads", "disk_obj_load_failures", "disk_hits",
                  "replans", "launch_refused", "preemptions", "failed"):
            out.setdefault(k, 0)
        if self.graph is not None:
            out.update(graph_captures=self.graph.captures, graph_replays=self.graph.replays,
                       graph_refused=self.graph.refused, graph_cuda=self.graph.cuda)
        return out

    # -- admission, preemption, failure ------------------------------------------------------
    def _lookup(self, req):
        """(plan, whether verified disk loads made it longer)."""
        cache = self.cache
        plan = cache.lookup(req.rid, req.seq, req.salt)
        if cache.disk_link is None or plan.disk_tokens <= plan.reuse_tokens or \
                plan.disk_choice not in ("load", "wait"):
            return plan, False
        before = dict(cache.disk_link.counts)
        self.counts["disk_prefetches"] += 1
        cache.prefetch(req.rid)
        cache.wait_loads(self.load_timeout)
        after = cache.disk_link.counts
        self.counts["disk_obj_loads"] += after["load_verified"] - before.get("load_verified", 0)
        self.counts["disk_obj_load_failures"] += after["load_miss"] - before.get("load_miss", 0)
        again = cache.lookup(req.rid, req.seq, req.salt)
        return again, again.reuse_tokens > plan.reuse_tokens

    def _start(self, req):
        plan, via_disk = self._lookup(req)
        req.hits.append(plan)
        req.started = True
        req.computed = req.allocated = plan.reuse_tokens
        req.cuts, req.schedule = [], []
        req.reused += plan.reuse_tokens
        req.disk_hits += via_disk
        self.counts["disk_hits"] += via_disk

    def _release(self, req):
        if req.started:
            self.cache.free(req.rid)
            req.started = False

    def _requeue(self, req, counter):
        """Back to the front of the queue; it looks up again when admitted."""
        self._release(req)
        self.counts[counter] += 1
        self.sched.requeue(req)

    def _fail(self, req, error):
        """A request that can never fit: reported on its output, everything released."""
        self._release(req)
        req.error = error
        self.counts["failed"] += 1
        self.sched.finish(req)

    def _allocate(self, req, n, drafts=0):
        """The Allocation, or None when the request left the running set (preempted itself,
        failed, or must look up again)."""
        while True:
            try:
                a = self.cache.allocate(req.rid, n, num_draft_tokens=drafts)
                break
            except RequestTooLarge as e:
                self._fail(req, e)
                return None
            except AdmissionRefused as e:
                victim = self.sched.victim(req)
                if victim is None and len(self.sched.running) == 1:
                    self._fail(req, CannotSchedule("request does not fit an empty cache",
                                                   (req.index, e.value)))
                    return None
                if victim is None:              # only older requests hold blocks: wait
                    self._requeue(req, "waits")
                    return None
                victim.preemptions += 1
                self._requeue(victim, "preemptions")
            except StaleRead:
                req.replans += 1
                self._requeue(req, "replans")
                return None
        req.allocated = a.end
        req.cuts = [P for P in a.checkpoints if P > req.computed]
        return a

    # -- one engine step ------------------------------------------------------------------
    def _work(self, req, budget):
        """(tokens, drafts) this request runs in this step, allocated; None to skip."""
        seq, L = req.seq, req.computed
        if req.allocated == L:
            todo = len(seq) - L
            drafts = self.spec.propose(seq, req.max_new - len(req.out) - 1) \
                if todo == 1 and req.out else []
            if drafts:
                if self._allocate(req, 1, len(drafts)) is None:
                    return None
                return [seq[-1]] + drafts, drafts
            n = max(1, min(todo, self.chunk - L % self.chunk, budget))
            gran = self.cache.layout.granule
            if n > gran and (L + n) % gran:
                n -= (L + n) % gran
            if self._allocate(req, n) is None:
                return None
        end = min([req.allocated] + [P for P in req.cuts if L < P < req.allocated])
        return seq[L:end], []

    def _step(self):
        budget = self.sched.step_tokens
        work = []
        for req in list(self.sched.running):
            if budget <= 0:
                break
            if req not in self.sched.running or not req.started:
                continue
            w = self._work(req, budget)
            if w is not None and req in self.sched.running:
                work.append((req, *w))
                budget -= len(w[0])
        work = [w for w in work if w[0] in self.sched.running and w[0].started
                and self._ready(w[0])]
        if not work:
            return
        batch = [SeqWork(toks, req.computed, self.cache.tables(req.rid), self._pins(req),
                         len(toks) - len(drafts)) for req, toks, drafts in work]
        if self.graph is not None:
            for (req, toks, drafts), w in zip(work, batch):
                if len(toks) == 1 and req.out:
                    self.graph.step(w)
                    break
        try:
            logits = self.model.forward(batch, self.cache)
        except LaunchRefused:
            for req, _, _ in work:             # its working state may be half written
                req.replans += 1
                self._requeue(req, "launch_refused")
            return
        for (req, toks, drafts), lg in zip(work, logits):
            self._finish_step(req, toks, drafts, lg)

    def _ready(self, req):
        """Right before the launch: the request's pinned objects are what it checked."""
        try:
            self.cache.begin_read(req.rid)
            return True
        except StaleRead:
            req.replans += 1
            self._requeue(req, "replans")
            return False

    def _pins(self, req):
        return {g.name: self.cache.launch_pins(req.rid, g.name) for g in self.cache.layout.groups}

    def _finish_step(self, req, toks, drafts, logits):
        L, cache = req.computed, self.cache
        req.recomputed += len(toks) - len(drafts)
        if drafts:
            j, nxt = self.spec.verify(logits, drafts)
            req.drafted += len(drafts)
            req.accepted += j
            cache.commit(req.rid, 1, toks[:1])
            if j == len(drafts):
                cache.accept_drafts(req.rid, drafts)
                req.computed = req.allocated = L + 1 + j
                req.schedule.append((L, L + 1 + j))
            else:                    # the accepted ones are recomputed next step
                cache.reject_drafts(req.rid)
                req.computed = req.allocated = L + 1
                req.schedule.append((L, L + 1))
            req.out += drafts[:j] + [nxt]
        else:
            cache.commit(req.rid, len(toks), toks)
            req.computed = L + len(toks)
            req.schedule.append((L, L + len(toks)))
            if req.computed == len(req.seq):
                req.out.append(int(logits[-1].argmax()))
        if req.done and req.computed >= len(req.seq) - 1:
            self._release(req)
            self.sched.finish(req)
