"""A pool's spec records as columns: one int64 row per block, one column per field of the
kind's record (spec.compressed.CompRec, ...).

A run of blocks changing state together (``Pool.fire_run``) reads its records with one gather
and writes them with one scatter, and the spec's guards and effects run on the columns (the
dual helpers' array mode); a single block's record is the spec's own namedtuple, built from its
row when read (``self[b]``) and written back whole (``put``).  There is no other
copy of a block's record.
"""
import struct
from array import array

import numpy as np

from hybridkv.errors import BadArgument

_tuple_new = tuple.__new__  # a record from its row's fields (the row has exactly the fields)
VALUES_RUN_MIN = 12     # ``values`` of fewer blocks reads them one by one (numpy costs ~1.8 us
#                         and ~0.03 a block, the buffer ~0.15 a block)


class RecordColumns:
    """``num_blocks`` records of ``rec_type`` (all at its defaults: FREE) as an int64 array:
    one buffer, read and written a row at a time through ``struct`` and a run at a time
    through the numpy view ``cols`` of the same bytes."""

    def __init__(self, rec_type, num_blocks):
        self.rec_type = rec_type
        self.width = len(rec_type._fields)
        self.field = {name: j for j, name in enumerate(rec_type._fields)}   # name -> column
        self._buf = array("q", bytes(8 * self.width * num_blocks))
        self.cols = np.frombuffer(self._buf, dtype=np.int64).reshape(num_blocks, self.width)
        self.cols[:] = np.asarray(rec_type(), dtype=np.int64)
        self._row = struct.Struct(f"={self.width}q")   # native order, as the array
        self._stride = self._row.size

    def __len__(self):
        return len(self.cols)

    # -- one block ------------------------------------------------------------------------
    def __getitem__(self, b):
        """Block b's record (a ``rec_type`` of Python ints)."""
        return _tuple_new(self.rec_type, self._row.unpack_from(self._buf, b * self._stride))

    def __setitem__(self, b, rec):
        self.put(b, rec)

    def put(self, b, rec):
        """Write block b's whole record."""
        if type(rec) is not self.rec_type:
            raise BadArgument(f"a {self.rec_type.__name__} record", rec)
        self._row.pack_into(self._buf, b * self._stride, *rec)

    def state(self, b):
        """Block b's state (the first field of every record) as a Python int."""
        return self._buf[b * self.width]

    def value(self, b, name):
        """Field ``name`` of block b as a Python int."""
        return self._buf[b * self.width + self.field[name]]

    def __iter__(self):
        return map(self.rec_type._make, self.cols.tolist())

    # -- runs -----------------------------------------------------------------------------
    def gather(self, blocks):
        """(index array, records as columns: a ``rec_type`` of int64 arrays) of ``blocks``;
        the columns are a copy (``scatter`` writes changes back)."""
        idx = np.asarray(blocks, dtype=np.int64)
        return idx, self.rec_type._make(self.cols[idx].T)

    def values(self, blocks, name):
        """Field ``name`` of each of ``blocks`` as a list of Python ints (a long run through
        one numpy gather, a short one read from the buffer)."""
        j = self.field[name]
        if len(blocks) >= VALUES_RUN_MIN:
            return self.cols[np.asarray(blocks, dtype=np.int64), j].tolist()
        buf, w = self._buf, self.width
        return [buf[b * w + j] for b in blocks]

    def scatter(self, idx, recs, olds):
        """Write ``recs`` (a ``rec_type`` whose fields are columns or scalars) to rows ``idx``,
        ``olds`` the columns ``gather`` read them from: a field of ``recs`` that is the very
        same column is unchanged (an effect's ``_replace`` keeps the fields it does not set),
        so only the fields that changed are written, a column at a time."""
        cols = self.cols
        for j, (values, old) in enumerate(zip(recs, olds)):
            if values is not old:
                cols[idx, j] = values

    def load(self, recs):
        """Replace every record (``recs``: one ``rec_type`` per block)."""
        if len(recs) != len(self.cols) or any(type(r) is not self.rec_type for r in recs):
            raise BadArgument("records do not fit this pool", len(recs))
        self.cols[:] = np.asarray(recs, dtype=np.int64).reshape(self.cols.shape)
