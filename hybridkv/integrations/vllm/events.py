"""hybridkv's cache event feed -> vLLM's KV events (the one place they translate).

``CacheManager(events=True)`` records a ``CacheEvent`` for every block filed in or taken out of
its prefix index; the adapter drains them right after each call it makes for a vLLM request
(the stored ones are that request's: its commit published them), so the request's token ids,
LoRA and session fill vLLM's ``BlockStored`` without the adapter keeping any request:

  CacheEvent(stored, group g<i>, key, parent, at)  BlockStored(block_hashes=[vLLM's hash of
                                                   the block ending at at, ...],
                                                   parent_block_hash, token_ids of the blocks,
                                                   group_idx=i, the group's spec kind); a run
                                                   of one group's consecutive blocks is one
                                                   event, as vLLM emits them
  CacheEvent(removed, group g<i>, key)             BlockRemoved([the hash key was reported
                                                   under], group_idx=i)
  a fresh CacheManager (reset_prefix_cache)        AllBlocksCleared (the adapter's)

A hybridkv chain block is one vLLM block (full attention); a window snapshot at ``at`` is
reported as the window group's block ending at ``at`` (the state through it is cached).
The adapter feeds them only with ``enable_kv_cache_events`` (else hybridkv records none: how
vLLM's hashes find hybridkv's blocks is hash_names.py, made off the hot path).
"""
from itertools import groupby, repeat
from operator import attrgetter

from vllm.distributed.kv_events import MEDIUM_GPU, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import (generate_block_hash_extra_keys,
                                         generate_lookahead_block_hash_extra_keys,
                                         maybe_convert_block_hash, to_event_extra_keys)
from vllm.v1.kv_cache_interface import (get_kv_cache_spec_kind,
                                        get_kv_cache_spec_sliding_window)


STORED_GROUP, KEY = attrgetter("stored", "group"), attrgetter("key")
AT = attrgetter("at")
FEED_RUN_MIN = 8     # a shorter batch goes event by event (each a run of one)
NO_KEYS = {}         # a group with no table yet: nothing to pop (only read or popped)


def removed_event(vllm_hash, i):
    """vLLM's BlockRemoved of the block group i had cached under ``vllm_hash``."""
    return BlockRemoved(block_hashes=[maybe_convert_block_hash(vllm_hash)], medium=MEDIUM_GPU,
                        group_idx=i)


def group_index(name):
    return int(name[1:])                   # layout_from_vllm names group i "g<i>"


class VllmEvents:
    """hybridkv's CacheEvents -> vLLM's KV events, named by vLLM's block hashes.

    A block is reported under the request's ``block_hashes`` entry at its end (vLLM names a
    group block by its last ``hash_block_size`` boundary's hash), with the tokens, extra keys
    and lookahead tokens a consumer rebuilds that hash from; a block vLLM has no hash for yet
    (its lookahead tokens not known) is not reported.  ``hashes[group]`` (hybridkv key -> the
    vLLM hash it was reported under) lets a removal name the same hash; hybridkv's keys stay
    internal.  The external form an event carries (``maybe_convert_block_hash``, an
    environment read per call) is made as vLLM's block pool makes it."""

    def __init__(self, kv_cache_config, hash_block_size, lookahead):
        self.config, self.hash_block_size = kv_cache_config, hash_block_size
        self.lookahead = lookahead
        self.hashes = {}        # group -> {hybridkv key: vLLM hash}

    def clear(self):
        self.hashes.clear()

    def vllm_hash(self, request, at):
        """The request's block hash at its block ending at ``at`` (None: not computed)."""
        i, hashes = at // self.hash_block_size - 1, request.block_hashes
        return hashes[i] if 0 <= i < len(hashes) else None

    def external(self, request, at):
        """``vllm_hash`` as a KV event names it."""
        h = self.vllm_hash(request, at)
        return None if h is None else maybe_convert_block_hash(h)

    def __call__(self, cache_events, request):
        """vLLM's events for CacheEvents (the stored ones published for ``request``): a run
        of one group's consecutive blocks is one BlockStored, as vLLM emits them.  The
        events go run by run (consecutive ones of one group, all stored or all removed)."""
        out = []                           # BlockRemoved, or [group index, block ends]
        if len(cache_events) < FEED_RUN_MIN:    # a decode's one or two: no run's setup
            for e in cache_events:
                self._one(e, request, out)
        else:
            for (stored, group), run in groupby(cache_events, STORED_GROUP):
                (self._stored if stored else self._removed)(group, list(run), request, out)
        return [self.stored(request, *e) if isinstance(e, list) else e for e in out]

    def _one(self, e, request, out):
        """One event (``_removed`` / ``_stored`` of a run of one, without a run's setup)."""
        i = group_index(e.group)
        if not e.stored:
            h = self.hashes.get(e.group, NO_KEYS).pop(e.key, None)
            if h is not None:
                out.append(removed_event(h, i))
            return
        h = self.vllm_hash(request, e.at)
        if h is None:
            return
        self.hashes.setdefault(e.group, {})[e.key] = h
        self._join(out, i, (e.at,))

    def _join(self, out, i, ends):
        """Emitted filings of group i ending at ``ends``: each joins the BlockStored before it
        when that one is of the same group and ends one block earlier."""
        bs = self.config.kv_cache_groups[i].kv_cache_spec.block_size
        for at in ends:
            if out and isinstance(out[-1], list) and out[-1][0] == i and \
                    out[-1][1][-1] == at - bs:
                out[-1][1].append(at)
            else:
                out.append([i, [at]])

    def _removed(self, group, run, request, out):
        """A run of one group's removals: each key's hash leaves the table (a C-speed map)."""
        i = group_index(group)
        hs = list(map(self.hashes.get(group, NO_KEYS).pop, map(KEY, run), repeat(None)))
        out += [removed_event(h, i) for h in hs if h is not None]

    def _stored(self, group, run, request, out):
        """A run of one group's filings: each under the request's hash at its end (none yet:
        not reported); consecutive block ends join one BlockStored."""
        i = group_index(group)
        hashes = self.hashes.setdefault(group, {})
        vllm_hashes, hbs = request.block_hashes, self.hash_block_size
        named = list(map(AT, run))
        if hbs > min(named) or max(named) // hbs > len(vllm_hashes):    # some not named yet
            kept = [k for k, at in enumerate(named) if 1 <= at // hbs <= len(vllm_hashes)]
            run, named = [run[k] for k in kept], [named[k] for k in kept]
        hashes.update(zip(map(KEY, run), [vllm_hashes[at // hbs - 1] for at in named]))
        self._join(out, i, named)

    def extra_keys(self, request, start, end):
        if self.lookahead:
            return generate_lookahead_block_hash_extra_keys(request, start, end,
                                                            end + self.lookahead, 0)[0]
        return generate_block_hash_extra_keys(request, start, end, 0)[0]

    def stored(self, request, i, ends):
        spec, lora = self.config.kv_cache_groups[i].kv_cache_spec, request.lora_request
        bs, tokens = spec.block_size, request.all_token_ids
        return BlockStored(
            block_hashes=[self.external(request, at) for at in ends],
            parent_block_hash=self.external(request, ends[0] - bs),
            token_ids=list(tokens[max(0, ends[0] - bs):ends[-1]]), block_size=bs,
            lora_id=getattr(lora, "adapter_id", None), medium=MEDIUM_GPU,
            lora_name=getattr(lora, "name", None), group_idx=i,
            extra_keys=to_event_extra_keys([self.extra_keys(request, max(0, at - bs), at)
                                            for at in ends]),
            kv_cache_spec_kind=get_kv_cache_spec_kind(spec).value,
            kv_cache_spec_sliding_window=get_kv_cache_spec_sliding_window(spec),
            session_id=getattr(request, "session_id", None),
            lookahead_token_ids=[list(tokens[at:at + self.lookahead]) for at in ends]
            if self.lookahead else None)
