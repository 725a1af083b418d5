"""Compact policy entries: the entries ``ValuePolicy.admit_chain`` admits, kept as (priority,
FLOPs, (kind, nbytes, tag)) until one is touched (made eligible, accessed), then an _Entry.

Two stores behind one interface.  ``CompactEntries`` is a dict (any hashable key).
``DenseCompactEntries`` serves a pool whose keys are its block ids ``0 .. n-1``
(``ValuePolicy.key_space``): the fields are columns indexed by key, so admitting or removing a
chain of blocks is a few numpy stores over the run, with no Python call per block; a single
key reads its column through the same buffer (a Python float, as the dict holds).
"""
from array import array
from itertools import repeat
from operator import itemgetter

import numpy as np

PRIO_OF_COMPACT = itemgetter(0)
SHORT_RUN = 16      # a dense store takes a shorter run key by key (numpy's fixed cost: ~20 us)


def plain(values):
    """A column of priorities or FLOPs as Python floats (a numpy one as a list): the dict and
    the per-entry paths hold and compute with Python's floats."""
    return values.tolist() if isinstance(values, np.ndarray) else values


class CompactEntries(dict):
    """key -> (prio, flops, (kind, nbytes, tag)) of each compact entry."""

    def prio(self, key):
        return self[key][0]

    def put_run(self, keys, prios, flops, meta):
        """New compact entries ``keys`` (as ``fresh_run`` returned them) with their
        priorities and FLOPs, sharing ``meta``."""
        self.update(zip(keys, zip(plain(prios), plain(flops), repeat(meta))))

    def fresh_run(self, keys, live):
        """``keys`` as ``put_run`` takes them when they are distinct and none is an entry yet
        (compact, or in ``live``); else None."""
        fresh = len(set(keys)) == len(keys) and live.keys().isdisjoint(keys) and \
            self.keys().isdisjoint(keys)
        return keys if fresh else None

    def count_in(self, keys):
        """How many of ``keys`` are compact entries."""
        return sum(map(self.__contains__, keys))

    def below(self, keys, bound):
        """How many of ``keys``, from the first, have a priority below ``bound`` when every
        one is a compact entry, else None (the caller asks key by key): a dict answers None."""
        return None

    def pop_max_prio(self, keys, default):
        """Remove the compact entries ``keys``; the largest priority among them (``default``
        when there are none)."""
        return max(default, max(map(PRIO_OF_COMPACT, map(self.pop, keys)), default=default))

    def joined(self, key):
        """``key`` became a live entry (``ValuePolicy._e``): nothing to note in a dict."""

    def left(self, keys):
        """``keys`` stopped being live entries: nothing to note in a dict."""


class DenseCompactEntries:
    """The compact entries of keys ``0 .. n-1`` as columns, and which keys are entries at all
    (``member``: compact or live), so a run's duplicate check is one gather."""

    def __init__(self, n):
        self.n, self.count = n, 0
        self._prio, self._flops = array("d", [0.0]) * n, array("d", [0.0]) * n
        self._meta = array("i", [-1]) * n          # index into ``metas``; -1: not compact
        self._member = bytearray(n)                # 1: an entry (compact or live)
        # 21 bytes a key; a compact entry in the dict takes ~200 (slot, tuple, two floats)
        self.metas, self._meta_ids = [], {}
        self.prios = np.frombuffer(self._prio, dtype=np.float64)
        self.flops = np.frombuffer(self._flops, dtype=np.float64)
        self.meta_ids = np.frombuffer(self._meta, dtype=np.int32)
        self.members = np.frombuffer(self._member, dtype=np.uint8)

    def _index(self, key):
        """``key``'s row, or -1 for a key outside the space (never an entry here)."""
        return key if type(key) is int and 0 <= key < self.n else -1

    def __len__(self):
        return self.count

    def _compact(self, key):
        """``key``'s row while it is a compact entry, else -1."""
        i = self._index(key)
        return i if i >= 0 and self._meta[i] >= 0 else -1

    def _row(self, key):
        """``key``'s row; KeyError while it is not a compact entry."""
        i = self._compact(key)
        if i < 0:
            raise KeyError(key)
        return i

    def _fields(self, i):
        return self._prio[i], self._flops[i], self.metas[self._meta[i]]

    def __contains__(self, key):
        return self._compact(key) >= 0

    def __getitem__(self, key):
        return self._fields(self._row(key))

    def prio(self, key):
        return self._prio[self._row(key)]

    def items(self):
        for key in np.flatnonzero(self.meta_ids >= 0).tolist():
            yield key, self[key]

    def pop(self, key, default=None):
        """Remove a compact entry; its fields (``default`` when ``key`` is none).  The key
        stays an entry: the caller makes it live or removes it (``left``)."""
        i = self._compact(key)
        if i < 0:
            return default
        out = self._fields(i)
        self._meta[i] = -1
        self.count -= 1
        return out

    def _rows(self, keys):
        """``keys`` as row numbers; KeyError names the first key outside ``0 .. n-1``."""
        rows = np.asarray(keys) if len(keys) else np.empty(0, dtype=np.int64)   # (its dtype
        # is the keys' own: a float or a str among them is refused below, never cast)
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or \
                (len(rows) and (rows.min() < 0 or rows.max() >= self.n)):
            raise KeyError(next(k for k in keys if self._index(k) < 0))
        return rows

    def put_run(self, rows, prios, flops, meta):
        meta_id = self._meta_ids.get(meta)
        if meta_id is None:
            meta_id = self._meta_ids[meta] = len(self.metas)
            self.metas.append(meta)
        if type(rows) is list:                         # a short run (``fresh_run``)
            _prio, _flops, _meta, _member = self._prio, self._flops, self._meta, self._member
            for k, p, f in zip(rows, plain(prios), plain(flops)):
                _prio[k], _flops[k], _meta[k], _member[k] = p, f, meta_id, 1
            self.count += len(rows)
            return
        self.prios[rows] = prios
        self.flops[rows] = flops
        self.meta_ids[rows] = meta_id
        self.members[rows] = 1
        self.count += len(rows)

    def fresh_run(self, keys, live):
        """As CompactEntries' (the keys as rows: a list for a short run of ints in the space,
        read key by key, else an int array); KeyError for a key outside the space."""
        n = len(keys)
        if 0 < n < SHORT_RUN and list(map(type, keys)).count(int) == n and \
                min(keys) >= 0 and max(keys) < self.n:
            if len(set(keys)) != n or any(map(self._member.__getitem__, keys)):
                return None
            return list(keys)
        rows = self._rows(keys)
        if self.members[rows].any():
            return None
        order = np.arange(len(rows), dtype=np.float64)
        self.prios[rows] = order       # (scratch: no entry's) a repeated key keeps its last
        return rows if (self.prios[rows] == order).all() else None

    def count_in(self, keys):
        try:
            rows = self._rows(keys)
        except KeyError:
            return sum(map(self.__contains__, keys))
        return int(np.count_nonzero(self.meta_ids[rows] >= 0))

    def below(self, keys, bound):
        """One gather of the priorities (None unless every key is a compact entry)."""
        try:
            rows = self._rows(keys)
        except KeyError:
            return None
        if not len(rows) or (self.meta_ids[rows] < 0).any():
            return None
        stop = ~(self.prios[rows] < bound)             # (a NaN stops, as ``not p < bound``)
        return int(np.argmax(stop)) if stop.any() else len(rows)

    def pop_max_prio(self, keys, default):
        if not len(keys):
            return default
        rows = self._rows(keys)
        top = float(self.prios[rows].max())
        self.meta_ids[rows] = -1
        self.count -= len(rows)
        return max(default, top)

    def joined(self, key):
        """``key`` became a live entry (KeyError outside the space)."""
        i = self._index(key)
        if i < 0:
            raise KeyError(key)
        self._member[i] = 1

    def left(self, keys):
        """``keys`` (in the space) are entries no more, whether compact or live."""
        if len(keys) == 1:
            self._member[keys[0]] = 0
        elif len(keys):
            self.members[self._rows(keys)] = 0
