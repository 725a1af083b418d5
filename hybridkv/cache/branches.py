"""Where prompts branch: the chain keys (one per hash granule) of prompts admitted lately, so a
new prompt learns how far it shares tokens with an earlier one even where no block holds them.

The funnel's branch point is the end of the cached compressed chain a request extends: it sees
a shared prefix only in whole chain blocks that are still cached.  A prompt that shares 200
tokens with an earlier one, under 128-token compressed blocks (v4-mini under a 16-token hash
granule), extends one cached block, so neither request retains a checkpoint where their prompts
part (200), and the third prompt of the family resumes at 128 where a 16-token-block LRU hits
200.  Marconi's radix tree knows that branch point from the tokens alone; ``SeenPrefixes`` is
that knowledge at granule precision, salted as the chain keys are (a tenant's keys never match
another's).  The manager writes a fork only ``min_fork`` tokens in or more (``Snapshots``).

A prompt that only extends an earlier one (a conversation's next turn: every key of the earlier
prompt, then more) is no fork: the earlier prompt's own end and repeat checkpoints are where it
resumes, and a second checkpoint there would only evict others (measured: the synthetic
stream's multi-turn conversations at 1k blocks lost 0.540 -> 0.480 when every shared prefix
counted).  A fork needs an earlier prompt that went on past the shared prefix.

It is a retention hint, never a source of state: a request reads nothing through it, and a key
forgotten (the table keeps the ``max_keys`` most recently admitted, least recent dropped first)
costs at most a branch snapshot not written.  A request is remembered when its first
allocation is admitted, never at lookup: an engine re-asks a waiting request every step, and
its own keys must not make it a branch of itself.
"""
from itertools import islice, takewhile

DEFAULT_MAX_KEYS = 1 << 16      # about 6 MB of key references at 100 bytes each


class SeenPrefixes:
    def __init__(self, max_keys=DEFAULT_MAX_KEYS):
        self.max_keys = max_keys
        # chain key -> whether an admitted prompt went on past it (an interior granule),
        # least recently admitted first
        self.keys = {}

    def shared(self, chain_keys, limit):
        """Where the prompt of ``chain_keys`` forks from the admitted ones, in granules (at
        most ``limit``): the leading granules some earlier prompt had, when an earlier prompt
        went on past the last of them; 0 when none did (the prompt extends an earlier one,
        whose own end checkpoint is where it resumes, or shares nothing).  Reads only."""
        keys = self.keys
        n = sum(1 for _ in takewhile(keys.__contains__, islice(chain_keys, limit)))
        return n if n and keys[chain_keys[n - 1]] else 0

    def remember(self, chain_keys):
        """An admitted prompt's chain keys become the most recent, each but its last marked
        interior; the least recent beyond ``max_keys`` are forgotten."""
        keys, last = self.keys, len(chain_keys) - 1
        for i, key in enumerate(chain_keys):
            keys[key] = keys.pop(key, False) or i < last
        excess = len(keys) - self.max_keys
        if excess > 0:
            for key in list(islice(keys, excess)):
                del keys[key]

    def __len__(self):
        return len(self.keys)
