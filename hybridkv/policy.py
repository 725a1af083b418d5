"""Pluggable eviction and retention policy for the cache manager (no torch, abstract metadata).

The manager owns the data and its structure; the policy only orders what may go. Protocol:
  admit(meta, now)   a new entry exists (not yet evictable)
  access(key, now)   the entry was used by a request (a hit, or re-demanded)
  eligible(key)      it may be evicted now (unpinned, and for a block: no cached children)
  ineligible(key)    it may not (pinned, or gained a cached child)
  victim()           the eligible key to evict next, or None; does not remove it
  remove(key, evicted=True)   the entry is gone (evicted, or invalidated when evicted=False)
  run_length(keys, forced)    how many of a chain of keys victim() would return in turn
  remove_run(keys)            remove each of them, each later one offered (eligible) first
  checkpoints(n_blocks, chain_blocks, full_blocks)   which block ends to keep checkpoints at
  unkept(n)          n blocks were written that the cache does not keep (a request's partial last
                     block): never entries, but blocks reuse is averaged over (optional)
One policy instance serves one pool (one object kind): state routing stays with the manager.

`FilteredLRUPolicy` (the benchmark's block-pool default, see its docstring) is exact LRU with a
front tier for classes reused far below average. `ValuePolicy` is greedy-dual over expected FLOPs
saved per byte:
  priority = clock + p(class) * (flops / nbytes) ** flops_weight
where `clock` is the priority of the last victim (so old entries age out: recency), flops_weight
(default 0.25) damps the FLOPs term (1 = plain GDSF cost/size, 0 = reuse only; a hit-rate vs
FLOPs-saved trade-off: on Mooncake 0.25 costs about 1% hit rate), and p(class) is the reuse
probability of the entry's class learned online: class = (kind, tag, min(uses, 3)); p = (uses
that moved an entry out of the class + 1) / (entries that entered it + 2). The trace teaches, e.g.,
that a request's last (partial) block is rarely reused and that a block used twice is likely
used again.

Retention (Marconi-style): keep checkpoints at the branch point (the end of the cached prefix a
request extends, when it extends it) and at the request's end (its last full block).
"""
from __future__ import annotations

import heapq
import itertools
from itertools import compress
from operator import attrgetter, not_

import numpy as np
from typing import Hashable, NamedTuple, Protocol, runtime_checkable

from hybridkv.policy_entries import CompactEntries, DenseCompactEntries, plain
from hybridkv.pow_memo import PowMemo

MAX_USES_CLASS = 3
PRIO = attrgetter("prio")     # an _Entry's priority
ARRAY_MIN = 32        # admit_chain computes a chain at least this long as numpy columns
SCAN_MIN = 16         # run_length reads at least this many compact priorities as one column


class PolicyError(KeyError):
    """An unknown or duplicate key was passed to a policy. Carries `value`."""

    def __init__(self, message: str, value):
        super().__init__(f"{message}: {value!r}")
        self.value = value


class EntryMeta(NamedTuple):
    key: Hashable
    kind: str                 # "block" or "checkpoint"
    nbytes: int
    flops: float              # FLOPs a hit through this entry saves
    tag: str = ""             # e.g. "tail" (a request's last, partial block), "branch", "end"


@runtime_checkable
class EvictionPolicy(Protocol):
    def admit(self, meta: EntryMeta, now: float) -> None: ...
    def access(self, key: Hashable, now: float) -> None: ...
    def eligible(self, key: Hashable) -> None: ...
    def ineligible(self, key: Hashable) -> None: ...
    def victim(self) -> Hashable | None: ...
    def remove(self, key: Hashable, evicted: bool = True) -> None: ...
    def checkpoints(self, n_blocks: int, chain_blocks: int, full_blocks: int) -> tuple: ...
    def __len__(self) -> int: ...


def marconi_checkpoints(n_blocks: int, chain_blocks: int, full_blocks: int) -> tuple:
    """Block indices whose end keeps a checkpoint: the branch point (chain_blocks - 1, when the
    request extends a cached prefix past it) and the request end (full_blocks - 1)."""
    out = []
    if 0 < chain_blocks < n_blocks:
        out.append(chain_blocks - 1)
    if full_blocks > 0 and full_blocks - 1 not in out:
        out.append(full_blocks - 1)
    return tuple(out)


def count_unkept(policy, n: int = 1) -> None:
    """Tell ``policy`` n blocks were written that the cache does not keep, where it takes
    that (``unkept`` is optional in the protocol)."""
    unkept = getattr(policy, "unkept", None)
    if unkept is not None:
        unkept(n)


class _Entry:
    """One policy entry: its meta's fields, uses, priority and live heap record's seq."""
    __slots__ = ("key", "kind", "nbytes", "flops", "tag", "uses", "prio", "seq")

    def __init__(self, key, kind, nbytes, flops, tag):
        self.key, self.kind, self.nbytes, self.flops, self.tag = key, kind, nbytes, flops, tag
        self.uses = 0
        self.prio = 0.0
        self.seq = -1             # seq of its live heap record; -1 = not eligible

    @property
    def meta(self) -> EntryMeta:
        return EntryMeta(self.key, self.kind, self.nbytes, self.flops, self.tag)


def _lazy_entry(key, compact) -> _Entry:
    """The _Entry of a compact one (ValuePolicy._lazy): uses 0, not eligible."""
    prio, flops, (kind, nbytes, tag) = compact
    e = _Entry(key, kind, nbytes, flops, tag)
    e.prio = prio
    return e


def _batches_chains(cls) -> bool:
    """``cls._chain_prios`` is the rule of ``cls._enter`` (one class defines both)."""
    owner = _CHAIN_RULE_OWNERS.get(cls)
    if owner is None:
        owner = _CHAIN_RULE_OWNERS[cls] = tuple(
            next(c for c in cls.__mro__ if name in c.__dict__)
            for name in ("_enter", "_chain_prios"))
    return owner[0] is owner[1]


_CHAIN_RULE_OWNERS: dict = {}


class ValuePolicy:
    """Greedy-dual on learned expected FLOPs saved per byte; see the module docstring."""

    admit_uses_seq = False    # admit() takes no sequence number (admit_chain batches it)

    def __init__(self, learn: bool = True, flops_weight: float = 0.25, recency: float = 0.0):
        self.learn = learn
        self.flops_weight = flops_weight
        self.recency = recency
        self._now = 0.0
        self.clock = 0.0
        self._e: dict = {}
        self._lazy = CompactEntries()  # key -> (prio, flops, (kind, nbytes, tag)): admitted
        # by admit_chain, untouched since (uses 0, not eligible); moved to _e when touched
        self._heap: list = []
        self._seq = itertools.count()
        self._entered: dict = {}
        self._moved: dict = {}
        self._pow = PowMemo(flops_weight)   # a chain's (FLOPs per byte) ** flops_weight

    def key_space(self, n: int) -> None:
        """Every key is an int in ``0 .. n-1`` (a pool's block ids): compact entries are kept
        as columns (policy_entries.DenseCompactEntries), so a chain is admitted and removed
        with a few numpy stores.  Only before the first entry; a key outside the space is
        then refused (PolicyError)."""
        if len(self):
            raise PolicyError("key space set after entries were admitted", n)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicyError("key space must be an int >= 0", n)
        self._lazy = DenseCompactEntries(n)

    def __len__(self) -> int:
        return len(self._e) + len(self._lazy)

    def __contains__(self, key) -> bool:
        return key in self._e or key in self._lazy

    def entries(self) -> dict:
        """key -> _Entry of every entry (those admit_chain left compact built as views)."""
        out = {key: _lazy_entry(key, v) for key, v in self._lazy.items()}
        out.update(self._e)
        return out

    def _cls(self, e: _Entry) -> tuple:
        uses = e.uses if e.uses < MAX_USES_CLASS else MAX_USES_CLASS
        return (e.kind, e.tag, uses)

    def reuse_probability(self, cls: tuple) -> float:
        if not self.learn:
            return 1.0
        return (self._moved.get(cls, 0) + 1.0) / (self._entered.get(cls, 0) + 2.0)

    def _value(self, e: _Entry, cls: tuple | None = None) -> float:
        """Expected saving per byte; ``cls``: the entry's class when the caller has it."""
        per_byte = max(e.flops, 0.0) / max(e.nbytes, 1)
        return self.reuse_probability(self._cls(e) if cls is None else cls) * \
            per_byte ** self.flops_weight

    def _get(self, key) -> _Entry:
        e = self._e.get(key)
        if e is None:
            v = self._lazy.pop(key, None)
            if v is None:
                raise PolicyError("unknown key", key)
            e = self._e[key] = _lazy_entry(key, v)
        return e

    def _prio(self, key) -> float:
        e = self._e.get(key)
        return self._lazy.prio(key) if e is None else e.prio

    def _enter(self, e: _Entry) -> None:
        c = self._cls(e)
        self._entered[c] = self._entered.get(c, 0) + 1
        e.prio = self.clock + self._value(e, c) + self.recency * self._now
        if e.seq >= 0:
            self.eligible(e.key)

    def admit(self, meta: EntryMeta, now: float = 0.0) -> None:
        if meta.key in self:
            raise PolicyError("duplicate key", meta.key)
        try:
            self._lazy.joined(meta.key)
        except KeyError:
            raise PolicyError("key outside the key space", meta.key) from None
        e = _Entry(meta.key, meta.kind, meta.nbytes, meta.flops, meta.tag)
        self._now = now
        self._e[meta.key] = e
        self._enter(e)

    def admit_chain(self, keys, kind, nbytes, flops, tag, now: float = 0.0) -> None:
        """``admit(EntryMeta(key, kind, nbytes, f, tag), now)`` of each key and its FLOPs
        ``f`` in order (new entries, none eligible yet; a chain's blocks share kind, size and
        tag): the same entries, priorities, class counts and sequence numbers, with no call per
        entry and no ``EntryMeta``: the priorities computed at once (``_chain_prios``), each
        entry kept compact (``_lazy``) until it is touched.  A subclass whose ``_enter`` has
        no ``_chain_prios`` beside it admits one by one.  A duplicate key raises PolicyError
        before anything changes."""
        if not _batches_chains(type(self)):
            for key, f in zip(keys, plain(flops)):
                self.admit(EntryMeta(key, kind, nbytes, f, tag), now)
            return
        if not len(keys):
            return
        try:
            run = self._lazy.fresh_run(keys, self._e)
        except KeyError as err:
            raise PolicyError("key outside the key space", err.args[0]) from None
        if run is None:
            raise PolicyError("duplicate key", next(k for i, k in enumerate(keys)
                                                    if k in self or k in keys[:i]))
        self._now = now
        prio = self._chain_prios(kind, nbytes, flops, tag, now)
        self._lazy.put_run(run, prio, flops, (kind, nbytes, tag))

    def _chain_prios(self, kind, nbytes, flops, tag, now):
        """The priorities ``_enter`` gives new entries of one class one after another (the
        class counts moved as those calls move them): greedy-dual's."""
        entered, n, cls = self._entered, len(flops), (kind, tag, 0)
        n0, m1 = entered.get(cls, 0), self._moved.get(cls, 0) + 1.0
        size, weight, base, later = max(nbytes, 1), self.flops_weight, self.clock, \
            self.recency * now
        entered[cls] = n0 + n
        if n < ARRAY_MIN:                                 # numpy's fixed cost outweighs it
            flops = plain(flops)
            return [base + (m1 / (n0 + i + 3.0) if self.learn else 1.0) *
                    (max(f, 0.0) / size) ** weight + later for i, f in enumerate(flops)]
        per_byte = np.maximum(np.asarray(flops, dtype=np.float64), 0.0) / size
        weighted = self._pow(per_byte, weight)      # Python's pow's bits (PowMemo)
        p = m1 / (np.arange(n, dtype=np.float64) + (n0 + 3.0)) if self.learn else 1.0
        return (base + p * weighted) + later

    def _next_seqs(self, n):
        """n sequence numbers, as n ``next(self._seq)`` calls take them, as floats."""
        start = next(self._seq)
        self._seq = itertools.count(start + n)
        return np.arange(start, start + n, dtype=np.float64)

    def access(self, key, now: float = 0.0) -> None:
        e = self._get(key)
        self._now = now
        if e.uses < MAX_USES_CLASS:
            c = self._cls(e)
            self._moved[c] = self._moved.get(c, 0) + 1
            e.uses += 1
            self._enter(e)
        else:                 # a saturated class re-enters itself: count both sides
            c = self._cls(e)
            self._moved[c] = self._moved.get(c, 0) + 1
            self._enter(e)

    def eligible(self, key) -> None:
        e = self._get(key)
        e.seq = next(self._seq)
        heapq.heappush(self._heap, (e.prio, e.seq, key))

    def ineligible(self, key) -> None:
        if key not in self._lazy:             # a compact entry is not eligible
            self._get(key).seq = -1

    def victim(self):
        heap = self._heap
        while heap:
            prio, seq, key = heap[0]
            e = self._e.get(key)
            if e is not None and e.seq == seq:
                return key
            heapq.heappop(heap)
        return None

    def remove(self, key, evicted: bool = True) -> None:
        e = self._e.pop(key, None)
        if e is None:
            v = self._lazy.pop(key, None)
            if v is None:
                raise PolicyError("unknown key", key)
            prio = v[0]
        else:
            prio = e.prio
        self._lazy.left((key,))
        if evicted and prio > self.clock:
            self.clock = prio     # greedy-dual aging: everything left now sits closer to eviction
        if len(self._heap) > 4 * (len(self._e) + len(self._lazy)) + 64:
            self._heap = [(x.prio, x.seq, k) for k, x in self._e.items() if x.seq >= 0]
            heapq.heapify(self._heap)

    def victims(self, n, go_on=None) -> list:
        """victim() and the keys it returns after it, one after another as each is removed
        (evicted) with nothing offered, touched or admitted between: at most n, and none after
        the first key ``go_on(key)`` is False for.  Priorities do not change while an entry
        waits, so the heap's order is that sequence; it changes no entry (stale heap records
        it passes go, as victim() drops them).  A subclass with its own ``remove`` answers
        victim() alone."""
        first = self.victim()
        if first is None or n < 2 or type(self).remove is not ValuePolicy.remove:
            return [] if first is None else [first]
        heap, live, out, valid = self._heap, self._e, [], []
        while heap and len(out) < n:
            rec = heapq.heappop(heap)
            e = live.get(rec[2])
            if e is None or e.seq != rec[1]:
                continue                            # stale: victim() would drop it too
            valid.append(rec)
            out.append(rec[2])
            if go_on is not None and not go_on(rec[2]):
                break
        for rec in valid:
            heapq.heappush(heap, rec)
        return out

    def run_length(self, keys, forced=frozenset()) -> int:
        """How many of ``keys`` victim() returns one after another, where ``keys[0]`` is
        victim() now and each later key is offered (eligible) only once the one before it was
        removed (a parent left a leaf): each while it is in ``forced`` (the caller takes those
        first) or its priority is below every other eligible entry's (an entry offered now
        loses a tie: its sequence number is the newest).  Priorities do not change while an
        entry waits, so this is decided up front; it changes no entry."""
        heap = self._heap
        if self.victim() != keys[0]:
            return 0
        top = heapq.heappop(heap)          # keys[0]'s record, put back below
        rival = self.victim()
        heapq.heappush(heap, top)
        bound = self._e[rival].prio if rival is not None else float("inf")     # eligible
        n, live, lazy = 1, self._e, self._lazy
        rest = keys[1:]
        if len(rest) >= SCAN_MIN and (not forced or set(forced).isdisjoint(rest)):
            k = lazy.below(rest, bound)       # None unless all are compact (so none is live)
            if k is not None:
                return 1 + k
        for key in rest:
            if key not in forced:
                e = live.get(key)                    # its priority (``_prio``, inlined)
                if not (lazy.prio(key) if e is None else e.prio) < bound:
                    break
            n += 1
        return n

    def remove_run(self, keys) -> None:
        """``remove`` (evicted) of each of ``keys`` in order, each one after the first offered
        (``eligible``) just before: the entries, clock and sequence numbers end as that
        sequence leaves them, with no heap record pushed for entries about to go (the clock
        rises to the largest priority removed; the heap is compacted at most once, at the
        end: a stale record is skipped by ``victim`` wherever it sits).  An unknown or
        repeated key raises PolicyError before anything changes."""
        live, lazy = self._e, self._lazy
        in_live = list(map(live.__contains__, keys))
        n_live = in_live.count(True)
        if len(set(keys)) != len(keys) or \
                n_live + lazy.count_in(keys) != len(keys):   # (disjoint)
            raise PolicyError("unknown key", next(k for i, k in enumerate(keys)
                                                  if k not in self or k in keys[:i]))
        if len(keys) > 1:                  # the numbers len(keys) - 1 eligible calls take
            self._seq = itertools.count(next(self._seq) + len(keys) - 1)
        if type(self).remove is not ValuePolicy.remove:
            for key in keys:
                self.remove(key)
            return
        clock, compact = self.clock, keys
        if n_live:
            compact = list(compress(keys, map(not_, in_live)))
            clock = max(clock, max(map(PRIO, map(live.pop, compress(keys, in_live)))))
        self.clock = lazy.pop_max_prio(compact, clock)
        lazy.left(keys)
        if len(self._heap) > 4 * (len(live) + len(lazy)) + 64:
            self._heap = [(x.prio, x.seq, k) for k, x in live.items() if x.seq >= 0]
            heapq.heapify(self._heap)

    def checkpoints(self, n_blocks: int, chain_blocks: int, full_blocks: int) -> tuple:
        return marconi_checkpoints(n_blocks, chain_blocks, full_blocks)

    def unkept(self, n: int = 1) -> None:
        """n blocks were written that the cache does not keep.  Greedy-dual learns reuse per
        class of its own entries only: nothing to count."""


class LRUPolicy(ValuePolicy):
    """Plain recency through the same protocol (for comparison): every entry has equal value."""

    admit_uses_seq = True     # an entry's priority is its admission's sequence number

    def _value(self, e: _Entry, cls: tuple | None = None) -> float:
        return 0.0

    def _enter(self, e: _Entry) -> None:
        e.prio = float(next(self._seq))
        if e.seq >= 0:
            self.eligible(e.key)

    def _chain_prios(self, kind, nbytes, flops, tag, now):
        """``_enter``'s priorities for new entries one after another: their sequence
        numbers."""
        return self._next_seqs(len(flops))


class FilteredLRUPolicy(ValuePolicy):
    """Recency first, predicted reuse as a filter (one parameter, `tau`); the block-pool policy
    of the benchmark's PolicyManager (whose checkpoint pool keeps ValuePolicy: there FLOPs per
    byte differ by depth) and of every pool in the runtime replay (bench.runtime).

    Order = last use (exact LRU), except that entries of a class whose learned reuse
    probability is below `tau` x the mean over all blocks written (its entries, and the partial
    last blocks a runtime never keeps: ``unkept``; e.g. a simulator's partial-last-block entries
    are about 0.2% reused against a 20-40% mean) form a front tier evicted first, LRU among
    themselves. The test is relative, so it adapts to capacity: where the cache is small every
    class is reused rarely and only the far-below-average ones are filtered; where it is ample
    the mean rises with them. Measured on both Mooncake traces x both layouts x 1k/10k/100k
    blocks (with ValuePolicy for checkpoints) it is >= LRU at all 12 points with the same tau;
    greedy-dual alone (ValuePolicy for blocks too) gains more at 1k blocks but loses to LRU at
    ample capacity (conversation, full, 100k: 0.3686 vs 0.3708)."""

    DEAD = -1e15
    admit_uses_seq = True

    def __init__(self, learn: bool = True, tau: float = 0.2):
        super().__init__(learn, 0.0)
        self.tau = tau
        self._n_in = 0
        self._n_mv = 0

    def mean_reuse(self) -> float:
        return (self._n_mv + 1.0) / (self._n_in + 2.0)

    def unkept(self, n: int = 1) -> None:
        """n blocks were written that the cache does not keep (a request's partial last
        block: the runtime never caches one, the simulator files it as an entry of its own
        class): they enter the mean over all blocks written and are never reused."""
        self._n_in += n

    def access(self, key, now: float = 0.0) -> None:
        self._n_mv += 1
        super().access(key, now)

    def filtered(self, cls: tuple) -> bool:
        return self.learn and self.reuse_probability(cls) < self.tau * self.mean_reuse()

    def _enter(self, e: _Entry) -> None:
        c = self._cls(e)
        self._entered[c] = self._entered.get(c, 0) + 1
        self._n_in += 1
        e.prio = float(next(self._seq)) + (self.DEAD if self.filtered(c) else 0.0)
        if e.seq >= 0:
            self.eligible(e.key)

    def _chain_prios(self, kind, nbytes, flops, tag, now):
        """``_enter``'s priorities for new entries of one class one after another: entry i
        is filtered by the counts after i + 1 entries (its class's and every block's), so the
        same float operations in the same order, one column."""
        n, cls = len(flops), (kind, tag, 0)
        n0, n_in = self._entered.get(cls, 0), self._n_in
        prio = self._next_seqs(n)
        self._entered[cls], self._n_in = n0 + n, n_in + n
        if not self.learn:
            return prio
        i = np.arange(n, dtype=np.float64)
        p = (self._moved.get(cls, 0) + 1.0) / (i + (n0 + 3.0))
        mean = (self._n_mv + 1.0) / (i + (n_in + 3.0))
        return prio + np.where(p < self.tau * mean, self.DEAD, 0.0)
