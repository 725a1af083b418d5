"""``x ** weight`` over float columns with the very bits Python's ``pow`` gives each value.

ValuePolicy prices an entry by ``per_byte ** flops_weight``: one entry at a time with Python's
float ``pow``, a chain's entries as a column.  numpy's ``power`` may round a value's last bit
otherwise (its vector loops), and the two paths must give the same priorities, so the column
takes each value from Python's ``pow`` too.  Calling it per value costs ~100 ns a block, but a
chain's blocks sit at the same positions request after request (its FLOPs per byte repeat), so
each distinct value is computed once and kept, sorted; a column then reads the known ones with
one search.
"""
import numpy as np

MEMO_CAP = 1 << 16      # values kept; past it a new value is computed each time it comes


class PowMemo:
    """``x ** weight`` (Python's ``pow`` per distinct value) for float64 columns."""

    def __init__(self, weight, cap=MEMO_CAP):
        self.weight, self.cap = weight, cap
        self.keys = np.empty(0, dtype=np.float64)     # ascending; no NaN
        self.vals = np.empty(0, dtype=np.float64)     # pow(keys[i], weight)

    def __call__(self, xs, weight):
        """``[pow(x, weight) for x in xs]`` as a float64 array (``xs``: a float64 array)."""
        if weight != self.weight:                     # (the policy's weight changed)
            self.__init__(weight, self.cap)
        n, keys = len(xs), self.keys
        if len(keys):
            at = np.minimum(np.searchsorted(keys, xs), len(keys) - 1)
            known = keys[at] == xs
            out = np.where(known, self.vals[at], 0.0)
        else:
            known, out = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.float64)
        if known.all():
            return out
        missed = xs[~known].tolist()
        vals = [pow(x, weight) for x in missed]
        out[~known] = vals
        self._keep(missed, vals)
        return out

    def _keep(self, xs, vals):
        """Keep the values just computed while under the cap; never NaN (it matches nothing)
        nor a zero (0.0 and -0.0 compare equal and may differ in pow: each computed anew)."""
        fresh = {x: v for x, v in zip(xs, vals) if x == x and x != 0.0}
        if not fresh or len(self.keys) + len(fresh) > self.cap:
            return
        keys = sorted(fresh)
        at = np.searchsorted(self.keys, keys)
        self.keys = np.insert(self.keys, at, keys)
        self.vals = np.insert(self.vals, at, [fresh[k] for k in keys])
