"""Speculative decoding: a drafter proposes tokens, one forward runs the real next token and the
drafts together, and greedy verification keeps the longest prefix the model agrees with.

In the cache (CacheManager.allocate with ``num_draft_tokens``) drafts get draft-only blocks and
draft tail targets; the forward writes the compressors' open windows there, so the working
tails keep the state before the step.  Every draft accepted: ``accept_drafts`` commits them and
the draft tails become the working ones.  Any rejected: ``reject_drafts`` releases every draft
object, and the accepted tokens are recomputed from the untouched working state (the next
token is already known: the draft forward's logit at the last accepted position depends only
on accepted tokens).
"""
from hybridkv.engine.drafter import NgramDrafter
from hybridkv.errors import BadArgument


class Speculator:
    def __init__(self, num_draft_tokens=0, drafter=None):
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) \
                or num_draft_tokens < 0:
            raise BadArgument("num_draft_tokens must be an int >= 0", num_draft_tokens)
        self.k = num_draft_tokens
        self.drafter = drafter or NgramDrafter(max(1, num_draft_tokens))

    def propose(self, seq, room):
        """Up to min(k, room) drafts continuing ``seq`` (none when speculation is off)."""
        if not self.k or room <= 0:
            return []
        return list(self.drafter.propose(seq))[:min(self.k, room)]

    @staticmethod
    def verify(logits, drafts):
        """(accepted count j, next token): logits[i] is the model's prediction after the
        i-th token of [last] + drafts; the next token follows the last accepted one."""
        j = 0
        while j < len(drafts) and int(logits[j].argmax()) == drafts[j]:
            j += 1
        return j, int(logits[j].argmax())
