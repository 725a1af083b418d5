"""Seeded engine bugs (for the fuzzer's must-find tests; never on by default).

  keep_rejected_drafts  a rejected draft rolls back only the state's length: the rejected
                        tokens' compressor rows and window entries stay (engine._speculate)
  ignore_plan           resume from the longest model state stored for the prompt, whether or
                        not the HitPlan validated it (its manager objects may be evicted: the
                        store's copy of those groups is then gone); the manager is told the
                        skipped span was computed
  publish_drafts        a partly rejected draft is accepted in the manager as a whole: state
                        of unverified draft tokens is published to the prefix index
"""
from hybridkv.errors import AdmissionRefused, StaleRead

BUGS = (None, "keep_rejected_drafts", "ignore_plan", "publish_drafts")


def ignore_plan(eng, req, plan):
    """(H to resume at, whether a demoted entry may be read) under the ``ignore_plan`` bug."""
    seq, salt, H = req.seq, req.salt, plan.reuse_tokens
    store = eng.store
    hs = [e.H for k, e in list(store.entries.items())
          if H < e.H < len(seq) and e.tokens == tuple(seq[:e.H])
          and k == store._key(seq, salt, e.H)]
    if not hs:
        return H, False
    Hs = max(hs)
    try:
        a = eng.cache.allocate(req.rid, Hs - H)
        if a.start != H:                       # the plan moved at pin time: not this once
            raise StaleRead("plan moved", a.start)
        eng.cache.begin_read(req.rid)
        eng.cache.commit(req.rid, Hs - H, seq[H:Hs])
    except (AdmissionRefused, StaleRead):
        eng.cache.free(req.rid)
        again = eng.cache.lookup(req.rid, seq, salt)
        req.hits[-1] = again
        req.mstart = again.reuse_tokens
        return again.reuse_tokens, False
    req.mstart, req.begun = Hs, True
    return Hs, True
