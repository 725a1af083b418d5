"""A pool's spec records as columns: one int64 row per block, one column per field of the
kind's record (spec.compressed.CompRec, ...).

A run of blocks changing state together (``Pool.fire_run``) reads its records with one gather
and writes them with one scatter, and the spec's guards and effects run on the columns (the
dual helpers' array mode); a single block's record is the spec's own namedtuple, built from its
row when read (``rec(b)``, ``self[b]``) and written back whole (``put``).  There is no other
copy of a block's record.
"""
import numpy as np

from hybridkv.errors import BadArgument


class RecordColumns:
    """``num_blocks`` records of ``rec_type`` (all at its defaults: FREE) as an int64 array."""

    def __init__(self, rec_type, num_blocks):
        self.rec_type = rec_type
        self.width = len(rec_type._fields)
        self.field = {name: j for j, name in enumerate(rec_type._fields)}   # name -> column
        self.cols = np.tile(np.asarray(rec_type(), dtype=np.int64), (num_blocks, 1))

    def __len__(self):
        return len(self.cols)

    # -- one block ------------------------------------------------------------------------
    def __getitem__(self, b):
        """Block b's record (a ``rec_type`` of Python ints)."""
        return self.rec_type._make(self.cols[b].tolist())

    def __setitem__(self, b, rec):
        self.put(b, rec)

    def put(self, b, rec):
        """Write block b's whole record."""
        if type(rec) is not self.rec_type:
            raise BadArgument(f"a {self.rec_type.__name__} record", rec)
        self.cols[b] = rec

    def state(self, b):
        """Block b's state (the first field of every record) as a Python int."""
        return self.cols.item(b, 0)

    def value(self, b, name):
        """Field ``name`` of block b as a Python int."""
        return self.cols.item(b, self.field[name])

    def __iter__(self):
        return map(self.rec_type._make, self.cols.tolist())

    # -- runs -----------------------------------------------------------------------------
    def gather(self, blocks):
        """(index array, records as columns: a ``rec_type`` of int64 arrays) of ``blocks``;
        the columns are a copy (``scatter`` writes changes back)."""
        idx = np.asarray(blocks, dtype=np.int64)
        return idx, self.rec_type._make(self.cols[idx].T)

    def column(self, blocks, name):
        """Field ``name`` of each of ``blocks`` as an int64 array."""
        return self.cols[np.asarray(blocks, dtype=np.int64), self.field[name]]

    def scatter(self, idx, recs):
        """Write ``recs`` (a ``rec_type`` whose fields are columns or scalars) to rows ``idx``."""
        out = np.empty((len(idx), self.width), dtype=np.int64)
        for j, values in enumerate(recs):
            out[:, j] = values
        self.cols[idx] = out

    def load(self, recs):
        """Replace every record (``recs``: one ``rec_type`` per block)."""
        if len(recs) != len(self.cols) or any(type(r) is not self.rec_type for r in recs):
            raise BadArgument("records do not fit this pool", len(recs))
        self.cols[:] = np.asarray(recs, dtype=np.int64).reshape(self.cols.shape)
