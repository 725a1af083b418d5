"""CacheManager.commit: positions [L, L+n) are computed; extend the request's chain keys,
publish what became known and seal what is complete (hybridkv.alloc)."""
from hybridkv import alloc as A
from hybridkv.calls import locked
from hybridkv.errors import BadTokens, CommitPastAllocation
from hybridkv.index import extend_chain
from hybridkv.reqstate import _count
from spec.state import LOOKED


def _extend_tokens(self, req, n, token_ids):
    """The request's tokens once positions [L, L+n) are committed (generated tokens
    come in ``token_ids``; prompt tokens are already known and must agree)."""
    tokens, L = req.tokens, req.L
    if token_ids is None:
        if len(tokens) < L + n:
            raise BadTokens("commit needs the ids of generated tokens", (len(tokens), L + n))
        return tokens
    extra = self._tokens(token_ids)
    if len(extra) != n:
        raise BadTokens("token_ids must hold num_tokens ids", (len(extra), n))
    known = tokens[L:L + n]
    if extra[:len(known)] != known:
        raise BadTokens("token_ids disagree with the prompt", (L, known, extra[:len(known)]))
    return tokens if len(known) == n else tokens[:L] + extra

@locked
def commit(self, request_id, num_tokens, token_ids=None):
    req = self._req(request_id)
    _count("num_tokens", num_tokens)
    if req.phase == LOOKED or num_tokens > req.A - req.L:
        raise CommitPastAllocation("commit past allocation",
                                   (num_tokens, req.A - req.L if req.phase != LOOKED else 0))
    tokens = self._extend_tokens(req, num_tokens, token_ids)
    req.tokens = tokens
    extend_chain(req.keys, req.root, tokens, self.layout.granule)
    req.L += num_tokens
    A.publish(self, req)
    A.seal_committed(self, req)
