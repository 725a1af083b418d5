"""Seeded bugs (for the must-find tests of the fuzzer; never on by default).  Each is a
subclass of the Engine or a seam swapped from outside the product -- the product never
branches on a bug flag.

  resume_off_plan  the engine resumes past the HitPlan: where it last computed the
                   conversation up to (it remembers what it served), telling the cache the
                   skipped span was computed
  stale_reads      the TOCTOU checks are gone: the cache pins whatever the plan named without
                   re-checking it (CacheManager._check_plan swapped out) and launches get no
                   pins and no begin_read -- a block evicted after the plan is read
  publish_drafts   a partly rejected draft is accepted in the cache as a whole (state of
                   unverified draft tokens published to the prefix index); the request then
                   looks up again and its own output stays right
"""
import contextlib

from hybridkv.cache import CacheManager
from hybridkv.engine import Engine

BUGS = (None, "resume_off_plan", "stale_reads", "publish_drafts")


class ResumeOffPlan(Engine):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.served = []           # (salt, tokens computed) of earlier requests

    def _start(self, req):
        super()._start(req)
        seq, H = req.seq, req.computed
        longer = [len(t) for s, t in self.served
                  if s == req.salt and H < len(t) < len(seq) and seq[:len(t)] == t]
        if longer and self._allocate(req, max(longer) - H) is not None:
            Hs = max(longer)
            self.cache.commit(req.rid, Hs - H, seq[H:Hs])      # never computed here
            req.computed = Hs

    def _release(self, req):
        if req.started:
            self.served.append((req.salt, req.seq[:req.computed]))
        super()._release(req)


class StaleReads(Engine):
    def _pins(self, req):
        return {}

    def _ready(self, req):
        return True


class PublishDrafts(Engine):
    def _finish_step(self, req, toks, drafts, logits):
        j, nxt = self.spec.verify(logits, drafts) if drafts else (0, 0)
        if not drafts or j == len(drafts):
            return super()._finish_step(req, toks, drafts, logits)
        req.drafted += len(drafts)
        req.accepted += j
        self.cache.commit(req.rid, 1, toks[:1])
        self.cache.accept_drafts(req.rid, drafts)          # the bug: every draft
        req.out += drafts[:j] + [nxt]
        self._requeue(req, "replans")


@contextlib.contextmanager
def seeded(bug):
    """(Engine class to build) with the bug's seams in force."""
    if bug is None:
        yield Engine
    elif bug == "resume_off_plan":
        yield ResumeOffPlan
    elif bug == "publish_drafts":
        yield PublishDrafts
    elif bug == "stale_reads":
        saved = CacheManager._check_plan
        CacheManager._check_plan = lambda self, req: None
        try:
            yield StaleReads
        finally:
            CacheManager._check_plan = saved
    else:
        raise ValueError(f"unknown seeded bug {bug!r}")
