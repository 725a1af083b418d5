"""Prefix index: chained granule hashes, per-pool object maps, checkpoint records, and the
prefix-tree relations eviction needs.

Keys.  ``root = H(tag, layout id, model version, salt)``; the chain key at H (a multiple of the
granule) is ``H(key(H - granule), tokens[H - granule:H])`` (blake2b, 16 bytes), extended one
granule at a time as tokens become known.  A chain block (comp / idx) ending at e is published
under the chain key at e, an exact object (snapshot) of a checkpoint at H under the chain key at
H, each in its own (kind, group) map: so the tenant salt, the layout id and the model version
key every group and every tier.

Relations.  Within one pool a chain block's parent is the chain block ending one block earlier,
and an exact comp / idx object's parent is the chain block its open block extends; ``children``
counts a block's cached children (eviction takes leaves before their ancestors).  A checkpoint
record at H hangs from (``anchors``) the deepest chain block of every chain pool below H; when an
anchor or one of its exact objects goes, the checkpoint can never be reached again: the record is
dropped and what only it could reach is reported dead (reclaimed first).

Block ends.  On a layout with one chain pool and no exact object at any block end (full
attention) a checkpoint at a block end consists of the chain blocks alone: it exists exactly
while the chain block ending there is published, so the chain map is its record
(``ends_pool``; ``has_checkpoint``) and no Checkpoint is filed per block.
"""
import hashlib
from array import array
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple


TAG = b"hybridkv/prefix/2"


class Checkpoint(NamedTuple):
    H: int
    key: bytes         # chain key at H
    anchors: tuple     # ObjRef: per chain pool, the chain block ending at H - H % block_size


NONE = ()     # an entry's children / anchored until it gets one


def _added(members, x):
    """``members`` (a tuple of at most one, else a set) with x: most chain blocks have one
    child and one checkpoint of their own, kept as a 1-tuple (48 B, where a set is 216 B)."""
    if not members:
        return (x,)
    if type(members) is tuple:
        return {members[0], x}
    members.add(x)
    return members


def _removed(members, x):
    if type(members) is tuple:
        return NONE if members == (x,) else members
    members.discard(x)
    return members


ENTRY_KEY, ENTRY_EXACT = attrgetter("key"), attrgetter("exact")
ENTRY_ANCHORED, ENTRY_CHILDREN = attrgetter("anchored"), attrgetter("children")
PARENT_BLOCK = attrgetter("parent.block")


class _Entry:
    __slots__ = ("key", "exact", "parent", "children", "anchored")

    def __init__(self, key, exact, parent, children=NONE):
        self.refill(key, exact, parent, children)

    def refill(self, key, exact, parent, children=NONE):
        """This entry as new (also when reused for its block's next publication)."""
        self.key, self.exact, self.parent = key, exact, parent
        self.children = children   # blocks of the same pool whose parent this is
        self.anchored = NONE       # chain keys of checkpoints hanging from this block


def _h(*parts):
    m = hashlib.blake2b(digest_size=16)
    for p in parts:
        m.update(p)
    return m.digest()


def root_key(layout, salt):
    return _h(TAG, b"|", layout.layout_id(), b"|", layout.model_version.encode(), b"|", salt)


def extend_chain(keys, root, tokens, granule, words=None):
    """Append chain keys for every full granule of ``tokens`` not yet in ``keys`` (only the new
    granules are hashed: the new tokens packed once, one blake2b call per granule).
    ``words``: ``tokens`` (a prefix of them) already packed as int64 words
    (``CheckedTokens.words``), read instead of packing them again."""
    n = len(tokens) // granule
    start = len(keys)
    if start >= n:
        return keys
    prev = keys[-1] if keys else root
    if words is None or len(words) < n * granule:
        words = array("q", tokens[start * granule:n * granule])
    else:
        words = words[start * granule:n * granule]
    packed, step = memoryview(words.tobytes()), granule * words.itemsize
    blake2b = hashlib.blake2b
    for off in range(0, (n - start) * step, step):
        prev = blake2b(prev + packed[off:off + step], digest_size=16).digest()
        keys.append(prev)
    return keys


def _ends_pool(layout):
    """The one chain pool when a layout has exactly one and no exact object at any of its
    block ends (a checkpoint there is the chain blocks alone), else None."""
    pools = layout.chain_pools()
    if len(pools) != 1:
        return None
    bs = layout.group(pools[0][1]).block_size
    if any(layout.exact_kinds(j * bs) for j in range(1, layout.lcm // bs + 1)):
        return None
    return pools[0]


class PrefixIndex:
    """Object maps per (kind, group), checkpoint records by chain key, tree relations."""

    def __init__(self, layout, refs):
        self.layout = layout
        self.refs = refs                           # pool key -> its blocks' ObjRefs (Pool.refs)
        pks = layout.pool_keys()
        self.chain = {pk: {} for pk in pks}        # chain key -> block
        self.exact = {pk: {} for pk in pks}        # chain key at H -> block
        self.entries = {pk: {} for pk in pks}      # block -> _Entry
        self.made = {pk: list(map(object.__new__, repeat(_Entry, len(refs[pk]))))
                     for pk in pks}                # block -> its one _Entry, made blank with
        # the index, filled when the block is published (refilled on each publication; read
        # only through ``entries``): the garbage collector finds one object per block id in
        # the start-up heap, never one per publication piling up in the old generation
        self.ckpts = {}                            # chain key -> Checkpoint
        self.ends_pool = _ends_pool(layout)        # its chain map records its block ends
        self.ends = None if self.ends_pool is None else self.chain[self.ends_pool]
        self._ends_bs = 0 if self.ends_pool is None else \
            layout.group(self.ends_pool[1]).block_size

    # -- queries ---------------------------------------------------------------------------
    def chain_block(self, kind, group, key):
        return self.chain[(kind, group)].get(key)

    def exact_block(self, kind, group, key):
        return self.exact[(kind, group)].get(key)

    def published(self, kind, group, b):
        return b in self.entries[(kind, group)]

    def key_of(self, kind, group, b):
        """(key, exact) a published block is filed under, or None."""
        e = self.entries[(kind, group)].get(b)
        return None if e is None else (e.key, e.exact)

    def keys_of_run(self, kind, group, blocks):
        """(keys, exact flags) the published ``blocks`` are filed under (each must be)."""
        ents = list(map(self.entries[(kind, group)].__getitem__, blocks))
        return list(map(ENTRY_KEY, ents)), list(map(ENTRY_EXACT, ents))

    def children(self, ref):
        e = self.entries[(ref.kind, ref.group)].get(ref.block)
        return 0 if e is None else len(e.children)

    def children_of(self, ref):
        """The blocks (ids, same pool) hanging from block ``ref``."""
        e = self.entries[(ref.kind, ref.group)].get(ref.block)
        return [] if e is None else list(e.children)

    def chain_at(self, kind, group, keys, end):
        """The published chain block of (kind, group) ending at ``end`` on the chain whose
        keys are ``keys`` (None when end <= 0 or none is published)."""
        if end <= 0:
            return None
        b = self.chain[(kind, group)].get(keys[end // self.layout.granule - 1])
        return None if b is None else self.refs[(kind, group)][b]

    def parent_for(self, kind, group, keys, at, exact):
        """What an object of (kind, group) at ``at`` hangs from: a chain block the one ending
        a block earlier, an exact comp / idx object the chain block its open block extends;
        other kinds hang from nothing."""
        if kind not in ("comp", "idx"):
            return None
        bs = self.layout.group(group).block_size
        return self.chain_at(kind, group, keys, at - (at % bs if exact else bs))

    def anchors_at(self, keys, H):
        """Per chain pool, the published chain block ending at H - H % block_size (what a
        checkpoint at H hangs from); None where a chain block below H is not published."""
        anchors = []
        for kind, gname in self.layout.chain_pools():
            bs = self.layout.group(gname).block_size
            a = self.chain_at(kind, gname, keys, H - H % bs)
            if a is not None:
                anchors.append(a)
            elif H >= bs:
                return None
        return anchors

    def has_checkpoint(self, key):
        """A checkpoint is recorded under chain key ``key`` (filed, or a block end of
        ``ends_pool``: its published chain block)."""
        return key in self.ckpts or (self.ends is not None and key in self.ends)

    def num_checkpoints(self):
        return len(self.ckpts) + (0 if self.ends is None else len(self.ends))

    def block_end(self, H):
        """A checkpoint at H is a block end of ``ends_pool`` (its chain block records it)."""
        return self._ends_bs > 0 and H % self._ends_bs == 0

    def parent(self, ref):
        """The block (an ObjRef in the same pool) that published block ``ref`` hangs from."""
        e = self.entries[(ref.kind, ref.group)].get(ref.block)
        return None if e is None else e.parent

    def reachable(self, ref):
        """A published block some recorded checkpoint can still reach through it (a chain
        block with children or checkpoints hanging from it, an exact object of a recorded
        checkpoint)."""
        e = self.entries[(ref.kind, ref.group)].get(ref.block)
        if e is None:
            return False
        if e.exact:
            return e.key in self.ckpts
        return bool(e.children or e.anchored) or (ref.kind, ref.group) == self.ends_pool

    def __len__(self):
        return sum(len(m) for m in self.entries.values())

    # -- changes ---------------------------------------------------------------------------
    def publish(self, ref, key, exact, parent=None):
        """File block ``ref`` under ``key`` unless the key is taken; True when published.
        ``parent`` (an ObjRef in the same pool, or None) gains a child."""
        pk = (ref.kind, ref.group)
        m = (self.exact if exact else self.chain)[pk]
        if key in m:
            return False
        m[key] = ref.block
        if parent is not None and parent.block not in self.entries[pk]:
            parent = None
        e = self.made[pk][ref.block]
        e.refill(key, exact, parent)
        self.entries[pk][ref.block] = e
        if parent is not None:
            pe = self.entries[pk][parent.block]
            pe.children = _added(pe.children, ref.block)
        return True

    def publish_run(self, kind, group, blocks, keys, parent):
        """``publish`` of chain blocks ``blocks`` under ``keys`` (none of them taken), each the
        next one's parent, the first hanging from ``parent`` (an ObjRef or None)."""
        pk = (kind, group)
        ents, m, refs = self.entries[pk], self.chain[pk], self.refs[pk]
        if parent is not None and parent.block not in ents:
            parent = None
        if not blocks:
            return
        if parent is not None:
            pe = ents[parent.block]
            pe.children = _added(pe.children, blocks[0])
        m.update(zip(keys, blocks))
        made = self.made[pk]
        parents = [parent, *map(refs.__getitem__, blocks[:-1])]
        children = [*zip(blocks[1:]), NONE]                # 1-tuples, as _added makes
        kept = list(map(made.__getitem__, blocks))
        for e, key, up, down in zip(kept, keys, parents, children):   # ``refill`` inline:
            e.key, e.exact, e.parent, e.children, e.anchored = key, False, up, down, NONE
        ents.update(zip(blocks, kept))                     # no call per block

    def add_checkpoint(self, H, key, anchors):
        """Record a checkpoint at H hanging from ``anchors`` (published chain blocks); False
        when one is already recorded under this key or an anchor is not published (a block
        end of ``ends_pool`` is recorded by its chain block: nothing is filed)."""
        if self.block_end(H):
            return False
        if key in self.ckpts or any(a.block not in self.entries[(a.kind, a.group)]
                                    for a in anchors):
            return False
        self._record(H, key, tuple(anchors))
        return True

    def add_block_ends(self, kind, group, blocks, keys, ends):
        """``add_checkpoint`` at the end of each chain block ``blocks`` (just published under
        ``keys``, so no anchor check), where that block is the checkpoint's one anchor (a
        layout with one chain pool and nothing exact at block ends): nothing to file when
        that pool is ``ends_pool``."""
        if (kind, group) == self.ends_pool:
            return
        ckpts, refs = self.ckpts, self.refs[(kind, group)]
        for b, key, H in zip(blocks, keys, ends):
            if key not in ckpts:
                self._record(H, key, (refs[b],))

    def _record(self, H, key, anchors):
        """File the checkpoint record and mark each anchor's entry with its key."""
        self.ckpts[key] = Checkpoint(H, key, anchors)
        for a in anchors:
            ae = self.entries[(a.kind, a.group)][a.block]
            ae.anchored = _added(ae.anchored, key)

    def unpublish(self, ref):
        """Take block ``ref`` out of the index.  Returns (leaves, dead): parents that lost
        their last child, and published objects no lookup can reach any more (the exact
        objects and unanchored leaf anchors of every checkpoint this block was part of)."""
        leaves, dead = [], []
        self._take((ref.kind, ref.group), ref.block, leaves, dead)
        return leaves, dead

    def unpublish_run(self, kind, group, blocks):
        """``unpublish`` of each of ``blocks`` in order, each one after the first the parent of
        the one before (``lone_ancestors``).  Returns what those calls return together, less
        the run's own blocks: (the top one's parent if it lost its last child, the dead in the
        order the calls report them).  A link between two of the run's blocks is never
        edited (both leave): ``_take`` skips it, and with it only reports of run blocks."""
        pk, leaves, dead, run = (kind, group), [], [], set(blocks)
        ents, chain = self.entries[pk], self.chain[pk]
        lone = self._lone_chain(pk, blocks, run)     # all but the top one at once
        if lone is not None:
            body, keys = list(blocks[:-1]), list(map(ENTRY_KEY, lone))
            if list(map(chain.get, keys)) == body:
                list(map(chain.__delitem__, keys))
                list(map(ents.__delitem__, body))
                blocks = blocks[-1:]
        for b in blocks:
            e = ents.get(b)
            if e is None or e.exact or e.anchored or e.parent is None or \
                    e.parent.block not in run or not run.issuperset(e.children):
                self._take(pk, b, leaves, dead, run)
                continue
            del ents[b]                 # linked to run blocks alone: ``_take`` edits nothing
            if chain.get(e.key) == b:   # else, reports nothing: only its map entry goes
                del chain[e.key]
        return leaves, [d for d in dead if d.block not in run or (d.kind, d.group) != pk]

    def _lone_chain(self, pk, blocks, run):
        """The entries of ``blocks`` but the last when each is a published chain block with no
        checkpoint of its own, whose parent is the next one given and whose children are in
        ``run`` (the one before it, for all but the first): what ``unpublish_run`` takes out
        editing nothing and reporting nothing, found with no Python step per block; else
        None."""
        if len(blocks) < 2:
            return None
        ents = self.entries[pk]
        body = list(map(ents.get, blocks[:-1]))
        if None in body or any(map(ENTRY_EXACT, body)) or any(map(ENTRY_ANCHORED, body)):
            return None
        try:
            ups = list(map(PARENT_BLOCK, body))
        except AttributeError:                        # a parent None
            return None
        lone = ups == list(blocks[1:]) and run.issuperset(body[0].children) and \
            list(map(ENTRY_CHILDREN, body[1:])) == list(zip(blocks[:-2]))
        return body if lone else None

    def _take(self, pk, b, leaves, dead, run=frozenset()):
        """Take block b of pool ``pk`` out; append to ``leaves`` and ``dead`` (``unpublish``).
        Links to blocks in ``run`` (leaving with it, ``unpublish_run``) are left as they are."""
        ents = self.entries[pk]
        e = ents.pop(b, None)
        if e is None:
            return
        m = (self.exact if e.exact else self.chain)[pk]
        if m.get(e.key) == b:
            del m[e.key]
        for c in e.children:                 # a forced drop (stale sweep): orphans
            if c not in run:
                ents[c].parent = None
        if e.parent is not None and e.parent.block not in run:
            pe = ents.get(e.parent.block)
            if pe is not None:
                pe.children = _removed(pe.children, b)
                if not pe.children:
                    leaves.append(e.parent)
                    if not pe.anchored and not pe.exact and pk != self.ends_pool:
                        dead.append(e.parent)
        if e.exact:
            dead += self._kill(e.key)
        elif e.anchored:
            for ck in list(e.anchored):
                dead += self._kill(ck)

    def lone_ancestors(self, kind, group, b, limit):
        """The blocks that become leaves one after another as published block b and then each
        of them leaves the index, at most ``limit``: (parents, dead) while b is its parent's
        only child and taking b out reports nothing dead in this pool but that parent
        (``dead[i]``: whether it does report ``parents[i]``, as ``unpublish`` would), then
        on from the parent."""
        pk = (kind, group)
        ents, parents = self.entries[pk], []
        get, add = ents.get, parents.append
        e = get(b)
        while limit > 0 and e is not None and e.parent is not None:
            p = e.parent.block
            pe = get(p)
            if pe is None or len(pe.children) != 1 or \
                    ((e.exact or e.anchored) and self._kills_in(pk, b, e)):
                break
            add(p)
            b, e, limit = p, pe, limit - 1
        if pk == self.ends_pool:             # its blocks record their own ends: none dead
            return parents, [False] * len(parents)
        return parents, [not (ents[p].anchored or ents[p].exact) for p in parents]

    def _kills_in(self, pk, b, e):
        """Taking block b (entry ``e``) out drops a checkpoint with another object in pool
        ``pk`` (an exact object, an anchor), which ``_kill`` may report dead."""
        exact = self.exact[pk]
        for ck in ((e.key,) if e.exact else e.anchored):
            c = self.ckpts.get(ck)
            if c is None:
                continue
            if exact.get(ck, b) != b:
                return True
            for a in c.anchors:
                if a.block != b and (a.kind, a.group) == pk:
                    return True
        return False

    def drops_quietly(self, kind, group, b, gone):
        """Taking published leaf b of pool (kind, group) out leaves nothing new in that pool:
        no parent without children (a leaf offered to its policy) and no exact object or
        anchor of a dropped checkpoint there (reported dead), so the pool's next victim is the
        policy's next.  ``gone``: parent block -> children of it taken out before b (in the
        same sweep, counted here when b is quiet)."""
        pk = (kind, group)
        e = self.entries[pk].get(b)
        if e is None or e.children or (e.exact or e.anchored) and self._kills_in(pk, b, e):
            return False
        if e.parent is not None:
            p = e.parent.block
            pe = self.entries[pk].get(p)
            if pe is not None:
                if len(pe.children) - gone.get(p, 0) < 2:
                    return False
                gone[p] = gone.get(p, 0) + 1
        return True

    def kills_elsewhere(self, kind, group, b):
        """Taking published block b of pool (kind, group) out drops a checkpoint with an
        object in another pool (an exact object, an anchor), which ``_kill`` may report
        dead there."""
        pk = (kind, group)
        e = self.entries[pk].get(b)
        if e is None:
            return False
        for ck in ((e.key,) if e.exact else e.anchored):
            c = self.ckpts.get(ck)
            if c is None:
                continue
            if any(pk2 != pk and self.exact[pk2].get(ck) is not None
                   for pk2 in self.layout.exact_kinds(c.H)):
                return True
            if any((a.kind, a.group) != pk for a in c.anchors):
                return True
        return False

    def _kill(self, key):
        """Drop the checkpoint record ``key``; its remaining exact objects, and anchors left
        with neither children nor checkpoints, are dead."""
        ck = self.ckpts.pop(key, None)
        if ck is None:
            return []
        dead = []
        for pk in self.layout.exact_kinds(ck.H):
            b = self.exact[pk].get(key)
            if b is not None:
                dead.append(self.refs[pk][b])
        for a in ck.anchors:
            ae = self.entries[(a.kind, a.group)].get(a.block)
            if ae is not None:
                ae.anchored = _removed(ae.anchored, key)
                if not ae.children and not ae.anchored and (a.kind, a.group) != self.ends_pool:
                    dead.append(a)
        return dead

    def check(self, pools):
        """Problems (empty list = sound): every filed key maps to its block and back, no free
        block is filed, children counts and anchors agree with the entries."""
        bad, kids = [], {}
        for pk, ents in self.entries.items():
            for b, e in ents.items():
                m = (self.exact if e.exact else self.chain)[pk]
                if m.get(e.key) != b:
                    bad.append(("key-map", pk, b))
                if pools[pk].recs.state(b) == 0:
                    bad.append(("free-published", pk, b))
                if e.parent is not None:
                    kids.setdefault((pk, e.parent.block), set()).add(b)
                for ck in e.anchored:
                    if ck not in self.ckpts:
                        bad.append(("anchor", pk, b))
            for m in (self.chain[pk], self.exact[pk]):
                for key, b in m.items():
                    if b not in ents or ents[b].key != key:
                        bad.append(("stale-key", pk, b))
        for pk, ents in self.entries.items():
            for b, e in ents.items():
                if set(e.children) != kids.get((pk, b), set()):
                    bad.append(("children", pk, b, sorted(e.children)))
        return bad
