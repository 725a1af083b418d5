"""Prefix index: chained block hashes, per-(kind, group) object maps, checkpoint records.

Keys.  ``root = H(tag, layout id, model version, salt)``; the chain key at H (a multiple of
the granule) is ``H(key(H - granule), tokens[H - granule:H])``; an object key is
``H(chain key, group name, role)`` with role ``chain`` (a full block ending at H) or ``ckpt``
(an object that exists only at exactly H).  So the tenant salt, the layout/ABI id and the model
version key every group and every tier (a disk copy is filed under the same object key).
blake2b, 16-byte digests.

A ``Checkpoint`` at H lists every object (kind, group, key, position it must cover) needed
to resume at H: per compressed group the full compressed blocks below H, the partial block
at H, the tail at H; the indexer's full blocks and its object at H; every group's window at H.

Retention (Marconi-style, the policy decides): checkpoints at the branch point (the end of
the cached prefix a request extends) and at the request's last aligned token; optionally
every N tokens.
"""
import hashlib
from array import array
from typing import NamedTuple

TAG = b"hybridkv/prefix/1"


class Need(NamedTuple):
    kind: str
    group: str
    key: bytes
    at: int            # the position the object must cover (spec covers(o, at, c))
    exact: bool = False  # an object that exists only at exactly H (not a shared chain block)


class Checkpoint(NamedTuple):
    H: int
    key: bytes         # chain key at H
    needs: tuple       # Need, grouped by layout group order


def _h(*parts):
    m = hashlib.blake2b(digest_size=16)
    for p in parts:
        m.update(p)
    return m.digest()


def root_key(layout, salt):
    return _h(TAG, b"|", layout.layout_id(), b"|", layout.model_version.encode(), b"|", salt)


def extend_chain(keys, root, tokens, granule):
    """Append chain keys for every full granule of ``tokens`` not yet in ``keys``."""
    n = len(tokens) // granule
    prev = keys[-1] if keys else root
    for i in range(len(keys), n):
        prev = _h(prev, array("q", tokens[i * granule:(i + 1) * granule]).tobytes())
        keys.append(prev)
    return keys


def obj_key(chain_key, group, role):
    return _h(chain_key, group.encode(), b"|", role)


class PrefixIndex:
    """Object maps per (kind, group) and checkpoint records by chain key."""

    def __init__(self, layout):
        self.layout = layout
        self.objs = {pk: {} for pk in layout.pool_keys()}
        self.key_of = {pk: {} for pk in layout.pool_keys()}
        self.ckpts = {}

    def needs(self, keys, H):
        """The Need list of a checkpoint at H (``keys``: the request's chain keys)."""
        gran = self.layout.granule
        at = lambda p: keys[p // gran - 1]                       # noqa: E731
        out = []
        for g in self.layout.groups:
            bs = g.block_size
            for kind in ("comp", "idx"):
                if kind in g.kinds:
                    out += [Need(kind, g.name, obj_key(at(e), g.name, b"chain"), e)
                            for e in range(bs, H - H % bs + 1, bs)]
            ck = obj_key(at(H), g.name, b"ckpt")
            if g.compressed and H % bs:
                out.append(Need("comp", g.name, ck, H, True))
            out += [Need(k, g.name, ck, H, True) for k in ("tail", "swa", "idx") if k in g.kinds]
        return tuple(out)

    def get(self, kind, group, key):
        return self.objs[(kind, group)].get(key)

    def put(self, kind, group, key, b):
        """Publish block b under key unless the key is taken; True when published."""
        m = self.objs[(kind, group)]
        if key in m:
            return False
        m[key] = b
        self.key_of[(kind, group)][b] = key
        return True

    def unpublish(self, kind, group, b):
        key = self.key_of[(kind, group)].pop(b, None)
        if key is not None:
            del self.objs[(kind, group)][key]
        return key

    def published(self, kind, group, b):
        return b in self.key_of[(kind, group)]

    def add_checkpoint(self, ck):
        if ck.key not in self.ckpts:
            self.ckpts[ck.key] = ck

    def prune(self):
        """Drop checkpoint records none of whose own (``ckpt``-role) objects is published."""
        dead = [k for k, ck in self.ckpts.items()
                if all(n.key not in self.objs[(n.kind, n.group)]
                       for n in ck.needs if n.exact)]
        for k in dead:
            del self.ckpts[k]
        return len(dead)


def retention_points(policy, prev_end, new_end, branch, granule, every_n=0):
    """Aligned positions in (prev_end, new_end] that get a checkpoint: the policy's choice
    (branch point, last aligned token) plus every N tokens."""
    n = new_end // granule
    pts = {(i + 1) * granule for i in policy.checkpoints(n, branch // granule, n)}
    if every_n:
        pts.update(range(every_n, new_end + 1, every_n))
    return sorted(p for p in pts if prev_end < p <= new_end and p % granule == 0)
