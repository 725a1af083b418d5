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
"""
import torch

from hybridkv.engine.ckpts import CheckpointStore
from hybridkv.engine.drafter import NgramDrafter
from hybridkv.engine.graph import DecodeGraph
from hybridkv.engine.scheduler import CannotSchedule, Request, Scheduler
from hybridkv.errors import AdmissionRefused, BadArgument, BadSalt, BadTokens, StaleRead
from hybridkv.model.cache import SeqState

BUGS = (None, "keep_rejected_drafts", "ignore_plan")


class Engine:
    def __init__(self, model, cache, chunk=8, max_running=4, step_tokens=64,
                 num_draft_tokens=0, drafter=None, model_blocks=1024, graph=True, bug=None):
        if chunk < 1 or chunk % cache.layout.granule:
            raise BadArgument("chunk must be a positive multiple of the hash granule", chunk)
        if bug not in BUGS:
            raise BadArgument("unknown seeded bug", bug)
        self.model, self.cache, self.chunk, self.bug = model, cache, chunk, bug
        self.mc = model.new_cache(model_blocks)
        self.store = CheckpointStore(cache)
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

    # -- admission / preemption -----------------------------------------------------------
    def _start(self, req):
        seq = req.seq
        plan = self.cache.lookup(req.rid, seq, req.salt)
        req.hits.append(plan)
        H = plan.reuse_tokens
        req.mstart, req.begun = H, False
        if self.bug == "ignore_plan":          # seeded bug: longest stored state, plan or not
            H = max([h for h in range(len(seq) - 1, 0, -1)
                     if self.store.get(seq, req.salt, h)] or [0])
        st = None
        if H:
            e = self.store.get(seq, req.salt, H)
            if e is not None:
                st = SeqState.restore(self.mc, e.ckpt)
                req.schedule = list(e.schedule)
                req.reused += H
            else:
                req.missing_ckpt += 1
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

    def _run(self, st, toks, cuts):
        """Forward ``toks`` split at the absolute positions ``cuts``; returns (logits,
        chunk bounds, {H: checkpoint at each cut})."""
        L, out, pieces, cks = st.length, [], [], {}
        bounds = [L] + [p for p in cuts if L < p < L + len(toks)] + [L + len(toks)]
        for a, b in zip(bounds, bounds[1:]):
            out.append(self.model.forward(toks[a - L:b - L], st))
            pieces.append((a, b))
            if b < bounds[-1]:
                cks[b] = st.checkpoint()
        return torch.cat(out), pieces, cks

    def _speculate(self, req, d):
        """One decode step with drafts ``d``.  Model checkpoints at aligned positions inside
        the step (where the manager may record a checkpoint) are stored only once they lie
        within the accepted tokens: nothing computed for a rejected draft is ever kept."""
        seq, st = req.seq, req.state
        L, last = st.length, seq[-1]
        gran = self.cache.layout.granule
        if self._allocate(req, 1, len(d)) is None:
            return 0
        before = st.checkpoint()
        cuts = [p for p in range(L + 1, L + 1 + len(d)) if p % gran == 0]
        logits, pieces, cks = self._run(st, [last] + d, cuts)
        j = 0
        while j < len(d) and int(logits[j].argmax()) == d[j]:
            j += 1
        self.cache.commit(req.rid, 1, [last])
        if j:
            self.cache.accept_drafts(req.rid, d[:j])
        else:
            self.cache.reject_drafts(req.rid)
        E = L + 1 + j
        if j < len(d):
            if self.bug == "keep_rejected_drafts":     # seeded bug: only the length rolls back
                st.length, pieces, cks = E, [(L, E)], {}
                nxt = int(logits[j].argmax())
            else:
                st.free()
                st = req.state = SeqState.restore(self.mc, before)
                logits, pieces, cks = self._run(st, [last] + d[:j], cuts)
                nxt = int(logits[-1].argmax())
        else:
            nxt = int(logits[-1].argmax())
        req.schedule += pieces
        req.recomputed += 1 + j
        req.drafted += len(d)
        req.accepted += j
        req.out += d[:j] + [nxt]
        for H, ck in cks.items():
            if H <= E:
                self.store.put_at(req.seq, req.salt, H, ck,
                                  [s for s in req.schedule if s[1] <= H])
        self.store.put(req.seq, req.salt, st, req.schedule)
        return 1 + len(d)
