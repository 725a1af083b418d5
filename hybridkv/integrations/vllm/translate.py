"""Translation state and rules between a vLLM ``Request`` and a hybridkv request.

``Tracked`` is the whole per-request state the adapter keeps (the vLLM request, positions it
handed to hybridkv, the checkpoints still ahead, the hit's window snapshots); ``salt_of`` is
the one place a vLLM request's cache isolation (cache_salt, LoRA, multimodal inputs) becomes
hybridkv's tenant salt.
"""
from dataclasses import dataclass, field

from hybridkv.cache.request import CheckedTokens
from hybridkv.errors import BadArgument


class HitMismatch(BadArgument):
    """vLLM asked to resume a request where hybridkv's lookup does not (value: request id,
    hybridkv's resume point, vLLM's)."""


@dataclass
class Tracked:
    request: object           # the vLLM Request (its computed and in-flight token counts)
    hit: int                  # hybridkv's resume point H from the last lookup
    hash_block_size: int = 0  # > 0: its token ids carry vLLM's block hashes (token_ids)
    started: bool = False     # the first allocation pinned the plan
    allocated: int = 0        # positions with slots in hybridkv (regular + lookahead)
    committed: int = 0        # positions committed to hybridkv (their token ids known)
    target: int = 0           # positions vLLM counts as cached: commits follow up to here
    settled: int = 0          # the settled basis hybridkv's windows last slid to
    points: list = field(default_factory=list)    # checkpoints ahead with snapshots, sorted
    windows: dict = field(default_factory=dict)   # group -> slot of the hit's window snapshot


@dataclass
class UnusedArgs:
    """vLLM constructor arguments that select vLLM-internal machinery hybridkv replaces."""
    max_in_flight_tokens: object = None
    num_prefill_lookahead: int = 0
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    metrics_collector: object = None


HASH_ID_MASK = (1 << 62) - 1


def hash_id(block_hash):
    """A vLLM block hash (bytes, or an int) as a hybridkv token id below 2**62."""
    if isinstance(block_hash, int):
        return block_hash & HASH_ID_MASK
    return int.from_bytes(bytes(block_hash)[:8], "big") & HASH_ID_MASK


def token_ids(request, start, end, hash_block_size=0):
    """The request's token ids [start, end) as hybridkv takes them.  vLLM's negative
    placeholder ids (multimodal inputs) map past every vocabulary id, distinct from each
    other and from real tokens.  With ``hash_block_size`` (a request vLLM hashes) the last
    position of hash block j is named by vLLM's hash of block j instead: it chains every
    block before and holds what vLLM keys a block by besides its tokens (the tokens after it
    that a drafter reads, ``num_hash_lookahead_tokens``; the multimodal inputs, LoRA, cache
    salt), so hybridkv's key at a block end is vLLM's identity of that prefix.  A prompt's
    ids go through in C-speed passes (a scan for placeholders, the block ends replaced as
    one strided slice)."""
    ids = request.all_token_ids[start:end]
    if type(ids) is not list:                 # (vLLM's ConstantList slices to a new list)
        ids = list(ids)
    if ids and min(ids) < 0:
        ids = [t if t >= 0 else (1 << 62) - t for t in ids]
    if hash_block_size:
        first, last = start // hash_block_size + 1, end // hash_block_size   # blocks ending
        if first <= last:                                                    # in [start, end)
            hashes = request.block_hashes[first - 1:last]
            if len(hashes) != last - first + 1:
                raise IndexError("block hash not computed yet", (last, len(request.block_hashes)))
            ids[first * hash_block_size - 1 - start::hash_block_size] = _hash_ids(hashes)
    return ids


def _hash_ids(hashes):
    """``hash_id`` of each of ``hashes`` (vLLM's bytes hashes without a call each)."""
    if len(hashes) > 1 and set(map(type, hashes)) == {bytes}:
        return [int.from_bytes(h[:8], "big") & HASH_ID_MASK for h in hashes]
    return list(map(hash_id, hashes))


class TranslatedIds:
    """One request's ``token_ids``, translated and checked once per position (hybridkv's
    CheckedTokens against the cache's ``vocab``): vLLM's token ids and block hashes only grow
    and callers ask only within ``known_positions``, so an id once known never changes (a
    waiting request is looked up again every step: only its new positions are translated,
    and the lookup checks and compares none of the old ones again)."""

    def __init__(self, request, hash_block_size, vocab=None):
        self.request, self.hash_block_size = request, hash_block_size
        self.ids = CheckedTokens(vocab)

    def fits(self, request, hash_block_size):
        return request is self.request and hash_block_size == self.hash_block_size

    def upto(self, end):
        """The ids of positions [0, end), as a prefix ``CacheManager.lookup`` takes."""
        if len(self.ids) < end:
            self.ids.extend(token_ids(self.request, len(self.ids), end, self.hash_block_size))
        return self.ids.prefix(end)


def known_positions(request, hash_block_size=0):
    """Positions whose hybridkv token id is known (``token_ids``): a block's last position
    waits for vLLM's hash of the block (after its lookahead tokens exist)."""
    if not hash_block_size:
        return request.num_tokens
    return min(request.num_tokens, (len(request.block_hashes) + 1) * hash_block_size - 1)


def salt_of(request):
    """hybridkv's tenant salt for a vLLM request: everything besides the tokens that vLLM puts
    in its block hashes (cache_salt, the LoRA adapter, multimodal inputs with their
    positions).  Requests differing in any of them never share a cached block."""
    lora = getattr(request, "lora_request", None)
    mm = tuple((f.identifier, f.mm_position.offset, f.mm_position.length)
               for f in getattr(request, "mm_features", None) or ())
    parts = (getattr(request, "cache_salt", None), getattr(lora, "lora_name", None), mm)
    return b"" if parts == (None, None, ()) else repr(parts).encode()
