"""vLLM's block hashes -> hybridkv's chain keys: how ``block_pool.get_cached_block`` finds a block.

hybridkv files a block under its chain key (the salted hash of every token up to its end); vLLM
names the same prefix by its block hash.  A keyed request's hybridkv token id at a hash block's
last position is vLLM's hash of that block (``translate.token_ids``), so the chain key at a
position where both exist names the same prefix as vLLM's hash there.  ``HashNames`` maps
vLLM's hash at such a position to hybridkv's key and to the position (two maps of bytes and
ints: no container per name for the garbage collector to walk).

It is a naming table, not cache state: whether a block is cached under the key is asked of
hybridkv's index on every read (``CacheManager.cached_block``), so a name whose block was evicted
answers None.  hybridkv files a block when a live request allocates it, so the names are made
off the hot path: a request leaving (``leave``) hands over its two lists of names (vLLM's
hashes, hybridkv's keys: two C-speed slices), and a read (``resolve``) that finds no name
first names every live request up to its allocated positions and folds the handed-over lists
in, keeping only keys filed now (a name found is right: the same hash is the same prefix).
Past ``limit`` names waiting or held the lists are folded and the table keeps only the names
of blocks filed then (live requests are named again from their start at the next read: a
name of theirs not filed yet may have gone).
"""
import math
from itertools import compress


class HashNames:
    def __init__(self, hash_block_size, granule, limit):
        self.hash_block_size, self.granule = hash_block_size, granule
        self.every = math.lcm(hash_block_size, granule)     # positions with both names
        self.limit = limit
        self.names = {}         # vLLM block hash -> hybridkv chain key
        self.ends = {}          # vLLM block hash -> the position its block ends at
        self.named = {}         # live request id -> positions named in ``names`` so far
        self.handed = []        # (hashes, keys, first position) of requests gone, not folded
        self.num_handed = 0

    def clear(self):
        self.names.clear()
        self.ends.clear()
        self.named.clear()
        self.handed.clear()
        self.num_handed = 0

    def resolve(self, cache, tracks, block_hash):
        """(chain key, position) vLLM's ``block_hash`` names, or None.  A name once made
        never changes (the same prefix), so one in the table answers at once; otherwise every
        live request (``tracks``: Tracked) is named and the lists handed over are folded in
        first (a connector asking hash after hash pays that once per miss: a scan of a
        prefix ends at its first)."""
        if block_hash not in self.names:
            self._name_live(cache, tracks)
            if self.handed:
                self._fold(cache)
        key = self.names.get(block_hash)
        return None if key is None else (key, self.ends[block_hash])

    def _name_live(self, cache, tracks):
        """Name every live request (``tracks``) up to its allocated positions."""
        for track in tracks:
            got = self._names(cache, track, self.named.get(track.request.request_id, 0))
            if got is not None:
                hashes, keys, first = got
                self._add(hashes, keys, range(first, 1 << 62, self.every))
                self.named[track.request.request_id] = first + (len(keys) - 1) * self.every

    def leave(self, cache, track):
        """The request is about to go (hybridkv still has its keys): its names are handed
        over as two lists, not put in the table."""
        got = self._names(cache, track, self.named.pop(track.request.request_id, 0))
        if got is None:
            return
        self.handed.append(got)
        self.num_handed += len(got[1])
        if self.num_handed + len(self.names) > self.limit:
            self._fold(cache)

    def _names(self, cache, track, start):
        """(vLLM hashes, chain keys, first position) of the request's positions past
        ``start`` up to its allocated ones where both names exist (equal lengths), or None."""
        request = track.request
        if not track.hash_block_size or not track.started:
            return None
        hbs, gran, every = self.hash_block_size, self.granule, self.every
        end = min(track.allocated, len(request.block_hashes) * hbs)
        end -= end % every
        if end <= start:
            return None
        first = start + every
        keys = cache.chain_keys(request.request_id, first // gran - 1, end // gran, every // gran)
        hashes = request.block_hashes[first // hbs - 1:end // hbs:every // hbs]
        n = min(len(keys), len(hashes))
        return (hashes[:n], keys[:n], first) if n else None

    def _add(self, hashes, keys, ends):
        """Name each of ``hashes`` (a list) by its key and block end, in order."""
        self.names.update(zip(hashes, keys))
        self.ends.update(zip(hashes, ends))

    def _fold(self, cache):
        """The handed-over names of keys filed now join the table; past ``limit`` the table
        keeps only names of keys filed now (live requests named again at the next read)."""
        filed, names, every = cache.filed_keys(), self.names, self.every
        if len(names) + self.num_handed > self.limit:
            self.names = names = {h: k for h, k in names.items() if k in filed}
            self.ends = {h: self.ends[h] for h in names}
            self.named.clear()
        for hashes, keys, first in self.handed:
            kept = list(map(filed.__contains__, keys))
            self._add(list(compress(hashes, kept)), compress(keys, kept),
                      compress(range(first, 1 << 62, every), kept))
        self.handed.clear()
        self.num_handed = 0
        self.limit = max(self.limit, 2 * len(names))
