"""Speculative decoding steps of the Engine (a mixin): one decode step with draft tokens, the
verification, and the rollback of every object on rejection (model state restored from the
pre-draft checkpoint, manager drafts rejected or accepted in part)."""
import torch

from hybridkv.model.cache import SeqState


class Speculation:
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
        if self.bug == "publish_drafts" and j < len(d):   # seeded bug: drafts published
            self.cache.accept_drafts(req.rid, d)
        elif j:
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
