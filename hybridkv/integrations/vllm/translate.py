"""Translation state and rules between a vLLM ``Request`` and a hybridkv request.

``Tracked`` is the whole per-request state the adapter keeps (positions it handed to hybridkv);
``salt_of`` is the one place a vLLM request's cache isolation (cache_salt, LoRA, multimodal
inputs) becomes hybridkv's tenant salt; ``commit_known`` the one place commits happen.
"""
from dataclasses import dataclass

from hybridkv.errors import BadArgument


class HitMismatch(BadArgument):
    """vLLM asked to resume a request where hybridkv's lookup does not (value: request id,
    hybridkv's resume point, vLLM's)."""


@dataclass
class Tracked:
    hit: int                  # hybridkv's resume point H from the last lookup
    started: bool = False     # the first allocation pinned the plan
    allocated: int = 0        # positions with slots in hybridkv (regular + lookahead)
    committed: int = 0        # positions committed to hybridkv (their token ids known)


@dataclass
class UnusedArgs:
    """vLLM constructor arguments that select vLLM-internal machinery hybridkv replaces."""
    max_in_flight_tokens: object = None
    num_prefill_lookahead: int = 0
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    metrics_collector: object = None


def cdiv(a, b):
    return -(-a // b)


def token_ids(request, start, end):
    """The request's token ids [start, end) as hybridkv takes them: vLLM's negative
    placeholder ids (multimodal inputs, whose content is in the salt) map past every
    vocabulary id, keeping them distinct from each other and from real tokens."""
    ids = request.all_token_ids[start:end]
    return [t if t >= 0 else (1 << 62) - t for t in ids]


def salt_of(request):
    """hybridkv's tenant salt for a vLLM request: everything besides the tokens that vLLM puts
    in its block hashes (cache_salt, the LoRA adapter, multimodal inputs with their
    positions).  Requests differing in any of them never share a cached block."""
    lora = getattr(request, "lora_request", None)
    mm = tuple((f.identifier, f.mm_position.offset, f.mm_position.length)
               for f in getattr(request, "mm_features", None) or ())
    parts = (getattr(request, "cache_salt", None), getattr(lora, "lora_name", None), mm)
    return b"" if parts == (None, None, ()) else repr(parts).encode()


def commit_known(cache, track, request, upto):
    """Commit positions up to ``upto`` to hybridkv, never past the tokens vLLM knows
    (``request.num_tokens``: speculative tokens are not known until accepted) nor past the
    allocation; a commit stops at every retention point on the way, so each is captured
    (vLLM computed them all: the rows a snapshot copies are still in the request's blocks)."""
    end = min(upto, request.num_tokens, track.allocated)
    if end <= track.committed:
        return
    stops = [P for P in cache.pending_checkpoints(request.request_id)
             if track.committed < P < end]
    for stop in stops + [end]:
        cache.commit(request.request_id, stop - track.committed,
                     token_ids(request, track.committed, stop))
        track.committed = stop
