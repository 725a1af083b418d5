"""A request's state inside the CacheManager, the per-group block tables the kernels read, the
allocation result, and the argument checks shared by the manager's methods.

Token intervals of one request (positions)::

    0 ........ H ......... num_computed_tokens ....... num_allocated_tokens ... + drafts
    |<- plan ->|<-------- committed -------->|<- allocated, not computed ->|<- draft ->|
    reused in place (chain blocks, pinned) and copied (snapshots at H), then computed here.
"""
import collections
from array import array
from functools import partial
from itertools import chain, repeat
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hybridkv.cache.funnel import HitPlan
from hybridkv.cache.pool import ObjRef
from hybridkv.cache.reads import Reads
from hybridkv.errors import BadArgument, BadTokens
from spec.state import LOOKED


class Owned(NamedTuple):
    """One object a request wrote: which block, the position it is written at (a chain
    block's end, a snapshot's H, a page's end), and the block's version when written -- with
    the block id, the identity of this incarnation (an eviction bumps the version)."""
    ref: ObjRef
    at: int
    ver: int

    @classmethod
    def write(cls, pool, p, draft=0):
        """A FREE block of ``pool`` written at position p (FREE -> WRITING)."""
        b = pool.alloc()
        rec = pool.write(b, p, draft)
        return cls(pool.refs[b], p, rec.ver)

    @classmethod
    def write_run(cls, pool, positions):
        """``write`` of one FREE block per position, as one run (Pool.write_run): (the
        blocks, their Owned)."""
        blocks, vers = cls.write_columns(pool, positions)
        return blocks, list(map(partial(tuple.__new__, cls),      # cls(*fields), no __new__
                                zip(map(pool.refs.__getitem__, blocks), positions, vers)))

    @staticmethod
    def write_columns(pool, positions):
        """``write_run`` as columns, no Owned made: (the blocks, their versions)."""
        blocks = pool.alloc_run(len(positions))
        pool.write_run(blocks, positions)
        return blocks, pool.recs.values(blocks, "ver")

    def live(self, pools):
        """The block still holds this incarnation (not evicted and reused since)."""
        rec = pools[(self.ref.kind, self.ref.group)].recs[self.ref.block]
        return rec.st != 0 and rec.ver == self.ver


class GroupTables:
    """Physical slots the kernels read for one request and one layer group (every layer of
    the group indexes its own view of the same pools with them).  Chain lists only grow;
    window pages slid out of the window become -1."""
    __slots__ = ("comp", "idx", "swa", "tail", "tail_write", "itail", "itail_write")

    def __init__(self):
        self.comp, self.idx, self.swa = [], [], []
        self.tail = self.tail_write = self.itail = self.itail_write = -1

    def chain(self, kind):
        return self.comp if kind == "comp" else self.idx


@dataclass(eq=False)
class GroupWork:
    """A request's working objects in one group: written in place, never published."""
    pages: collections.deque = field(default_factory=collections.deque)  # Owned, oldest first
    first_page: int = 0            # page number of pages[0]
    tail: Owned = None             # compressor's open window
    itail: Owned = None            # indexer compressor's open window (an idx block's tail)
    draft_tail: Owned = None       # where a draft forward writes them
    draft_itail: Owned = None


class Allocation(NamedTuple):
    start: int             # first position of this allocation
    end: int               # one past its last regular position
    draft_end: int         # one past its last draft position
    checkpoints: tuple     # positions in (start, end] where a commit ending there snapshots
    tables: dict           # group -> GroupTables (live: the request's tables)
    copied_bytes: int      # snapshot bytes copied by this allocation (a hit's restore)
    copies: tuple = ()     # those copies: (kind, group, source slot, destination slot) each,
    #                        for an engine whose worker moves the bytes (slots of tables())


class SlotCopy(NamedTuple):
    """One snapshot capture's copy, for an engine whose worker moves the bytes: rows
    [row_start, row_end) (None: to the last row) of tensor ``tensor`` ("": every tensor) of
    slot ``src`` into the same rows of slot ``dst`` (slots of pool (kind, group), as
    ``tables()`` holds them).  A pool whose blocks span k arena pages also names each block's
    pages as they were at the capture (``src_pages``, ``dst_pages``: the commit that captured
    may slide the source window away before the engine reads the copy)."""
    kind: str
    group: str
    src: int
    dst: int
    row_start: int = 0
    row_end: int = None
    tensor: str = ""
    src_pages: tuple = ()
    dst_pages: tuple = ()


class CacheEvent(NamedTuple):
    """One change of what the cache holds, for an engine's KV events
    (``CacheManager(events=True)``, drained by ``take_events``): a block filed in the prefix
    index (``stored``: a lookup can hit it now) or taken out of it (evicted, dropped)."""
    stored: bool
    kind: str
    group: str
    key: bytes             # its chain key (the hash of every token up to ``at``, salted)
    parent: object         # stored chain block: its parent's key (None at the root / removed)
    at: object             # stored: the position it covers up to (None when removed)
    exact: bool            # a snapshot at exactly ``at`` (else a chain block ending there)
    request_id: object     # stored: the request whose commit published it (None when removed)

    @classmethod
    def removed_run(cls, kind, group, keys, exacts):
        """The removal events of a run of one pool's blocks filed under ``keys`` (their
        ``exacts`` beside them), in order, made at C speed."""
        return map(partial(tuple.__new__, cls), zip(
            repeat(False), repeat(kind), repeat(group), keys, repeat(None), repeat(None), exacts,
            repeat(None)))

    @classmethod
    def stored_chain(cls, kind, group, keys, ends, parent, request_id):
        """The filing events of a chain run of one pool (``keys`` ending at ``ends``, each the
        next one's parent, the first under ``parent``'s key), in order, made at C speed."""
        return map(partial(tuple.__new__, cls), zip(
            repeat(True), repeat(kind), repeat(group), keys, chain([parent], keys), ends,
            repeat(False), repeat(request_id)))


@dataclass(eq=False)
class Request:
    request_id: object
    salt: bytes
    root_key: bytes
    token_ids: list                 # the tokens known so far (prompt, then generated)
    chain_keys: list                # chain key per full granule of token_ids
    plan: HitPlan
    prompt_len: int
    hint: str = ""                  # the caller's class of the request (eviction policy)
    token_source: object = None     # the CheckedTokens token_ids were a prefix of, or None
    phase: int = LOOKED
    num_computed_tokens: int = 0    # committed: their state is in the request's objects
    num_allocated_tokens: int = 0
    num_draft_tokens: int = 0
    num_settled_tokens: int = 0     # positions whose queries have run: windows slide past
    #                                 those only (commit's settled_tokens; all committed ones
    #                                 by default)
    reads: Reads = field(default_factory=Reads)    # pinned shared objects it reads, by pool
    tables: dict = field(default_factory=dict)     # group -> GroupTables
    work: dict = field(default_factory=dict)       # group -> GroupWork
    blocks: dict = field(default_factory=dict)     # chain pool -> logical block per chain index
    chain: dict = field(default_factory=dict)      # chain pool -> deque of Owned, not sealed
    unpublished: list = field(default_factory=list)  # heap (at, exact, seq, Owned): keys unknown
    private: list = field(default_factory=list)    # Owned copies whose key another block holds
    snapshots: dict = field(default_factory=dict)  # P -> [Owned] exact objects at P
    snapshot_tags: dict = field(default_factory=dict)   # P -> {"branch","fork","every",...}
    pending_points: list = field(default_factory=list)  # P written, not yet captured (sorted)
    sealed_points: list = field(default_factory=list)   # P captured (complete), in order
    to_publish: dict = field(default_factory=dict)      # P -> exact objects left to publish
    drafts: list = field(default_factory=list)     # Owned draft-only chain blocks and pages
    seq: int = 0                                   # tie-break for the heap
    fast_end: int = -1        # allocations ending at or before: no block, no checkpoint
    reach_end: int = -1       # ... and nothing but window sub-pages (CacheManager._reach)
    next_event: int = -1      # first commit end that seals, captures, publishes or slides
    shared_tokens: int = 0    # prompt tokens an earlier admitted prompt shares (SeenPrefixes)

    @property
    def known_tokens(self):
        return len(self.token_ids)

    def working_objects(self):
        """Every object the request writes and releases when freed (never shared): its
        tails and window pages (draft targets included), draft blocks, private copies and
        unsealed chain blocks.  The one list free() releases and checked mode counts."""
        for work in self.work.values():
            for o in (work.draft_tail, work.draft_itail, work.tail, work.itail):
                if o is not None:
                    yield o
            yield from work.pages
        yield from self.drafts
        yield from self.private
        for unsealed in self.chain.values():
            yield from unsealed


def check_count(name, v, minimum=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BadArgument(f"{name} must be an int >= {minimum}", v)


def check_timeout(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise BadArgument(f"{name} must be a number of seconds >= 0", v)


SHORT_TOKENS = 16      # check_tokens checks up to this many ids in a plain loop


def check_tokens(token_ids, vocab):
    """A list of ints in [0, vocab), checked in bulk: one C-speed pass over the types (plain
    ints only: no bool, no float, no numpy scalar), then the range read off an int64 packing
    (anything that does not fit fails it).  A failure is located by a plain scan: the error
    names the first bad token."""
    return _check(token_ids, vocab)[0]


def _check(token_ids, vocab):
    """``check_tokens``' list, and the int64 packing its range check read (an ``array("q")``)
    or None where a short list was checked in a plain loop."""
    if type(token_ids) is not list and hasattr(token_ids, "tolist") and \
            not isinstance(token_ids, (list, tuple)):
        token_ids = token_ids.tolist()
    if type(token_ids) is not list and not isinstance(token_ids, (list, tuple)):
        raise BadTokens("token_ids must be a sequence of ints", type(token_ids).__name__)
    if not token_ids:
        return [], None
    if len(token_ids) <= SHORT_TOKENS:          # a decode step's few ids: no numpy
        top = (1 << 63) if vocab is None else vocab
        for t in token_ids:
            if type(t) is not int or not 0 <= t < top:
                raise _first_bad(token_ids, vocab)
        return list(token_ids), None
    if list(map(type, token_ids)).count(int) != len(token_ids):   # (a count of identical
        raise _first_bad(token_ids, vocab)       # types: about half a set's cost)
    try:
        words = array("q", token_ids)
    except OverflowError:
        raise _first_bad(token_ids, vocab) from None
    packed = np.frombuffer(words, dtype=np.int64)
    bad = bool(packed.min() < 0 or (vocab is not None and packed.max() >= vocab))
    del packed                                  # (no view of ``words`` outlives the check)
    if bad:
        raise _first_bad(token_ids, vocab)
    return list(token_ids), words


class CheckedTokens:
    """One prompt's token ids, checked once as they arrive (``check_tokens`` against
    ``vocab``) and append-only.  An engine re-asks a waiting request every step: it passes
    ``prefix(n)`` to ``CacheManager.lookup``, which then checks no token twice and, looking
    the same source up again, compares none it already holds (a prefix of an append-only list
    never changes)."""
    __slots__ = ("vocab", "_ids", "words")

    def __init__(self, vocab, token_ids=()):
        ids, words = _check(token_ids, vocab)
        self.vocab, self._ids = vocab, ids
        self.words = array("q", ids) if words is None else words   # the ids as int64 words:
        # packed once on arrival, the bytes a lookup hashes (index.extend_chain)

    def extend(self, token_ids):
        """Append ``token_ids`` (checked; BadTokens changes nothing)."""
        ids, words = _check(token_ids, self.vocab)
        self._ids += ids
        self.words.extend(array("q", ids) if words is None else words)

    def __len__(self):
        return len(self._ids)

    def prefix(self, end):
        """The ids of positions [0, end), for ``CacheManager.lookup``."""
        if isinstance(end, bool) or not isinstance(end, int) or not 0 <= end <= len(self._ids):
            raise BadArgument("prefix end must be an int in [0, len]", end)
        return TokenPrefix(self, end)

    def ids(self, end):
        """A new list of the ids of positions [0, end)."""
        return self._ids[:end]


class TokenPrefix(NamedTuple):
    source: CheckedTokens
    end: int


def lookup_tokens(token_ids, vocab, looked=None):
    """(tokens, source) for a lookup: the ids of a ``TokenPrefix`` of ``CheckedTokens``
    (checked again only when checked against another ``vocab``), anything else through
    ``check_tokens``; source is the CheckedTokens whose check stands, else None.
    ``looked``: the ids a looked-up request holds from the same source (a waiting request
    looked up again): its list is the same prefix when it has the same length (append-only
    source), so it is taken as it is, not copied again."""
    if type(token_ids) is TokenPrefix and type(token_ids.source) is CheckedTokens:
        same = token_ids.source.vocab == vocab
        if same and looked is not None and looked[1] is token_ids.source and \
                len(looked[0]) == token_ids.end:
            return looked
        ids = token_ids.source.ids(token_ids.end)
        if same:
            return ids, token_ids.source
        token_ids = ids
    return check_tokens(token_ids, vocab), None


def _first_bad(token_ids, vocab):
    """BadTokens naming the first token that is not an int in [0, vocab)."""
    for i, t in enumerate(token_ids):
        if type(t) is not int or t < 0 or (vocab is not None and t >= vocab) or t >= 1 << 63:
            return BadTokens("token out of range", (i, t))
    raise AssertionError("no bad token")
