"""Per-(kind, group) pools: the KV memory the kernels read, a free list, one spec record per block.

Storage is layer-major, one tensor per name the layout gives the kind
(``ModelLayout.pool_tensors``): ``data[name]`` is ``[n_layers, slots, rows, dim]`` and a layer's
view ``layer(name, j)`` is ``[slots, rows, dim]``, the tensor a kernel launch reads through a
block table of physical slots.  Block ids are logical; ``slot(b)`` is where block b lives now
(one spare slot per pool makes relocation real: ``relocate`` copies the block's rows of every
layer into the spare slot, so its address changes, and fires the spec's ``relocate``).

Every state change of a block goes through ``fire``: the compiled table of the kind's machine
(hybridkv.cache.tables) with the spec's guard functions, then the spec's effect function on
the block's own spec record (CompRec / TailRec / SwaRec / IdxRec), one row of the pool's record
columns (hybridkv.cache.records).  In checked mode a real python-statemachine instance shadows
each block (CheckedMachine).  ``fire_run`` is ``fire`` for a run of blocks changing state
together (a prefill's chain blocks, a free's reads): one gather of the run's rows, the table's
guards and the effect called once over them as columns, one scatter back.
"""
from functools import partial
from itertools import repeat
from typing import NamedTuple

import numpy as np
import torch

from hybridkv.cache.records import RecordColumns
from hybridkv.cache.storage import storage
from hybridkv.cache.tables import CheckedMachine, TransitionRefused, distinct, table_for
from hybridkv.errors import BadArgument
from hybridkv.layout import slot_bytes
from spec.common import FREE, PINNED, READY, WRITING
from spec.effects import EFFECTS
from spec.funnel import GPU_BLOCK_ALIGN, can_hit_bytes
from spec.state import KINDS, MACHINES, RECS

REC = dict(zip(KINDS, RECS))
MACHINE = dict(zip(KINDS, MACHINES))
RUN_MIN = 8       # shorter runs go block by block: a run costs ~21-28 us whatever its length, a
                  # block 3-5 us by event (even at 6-8 blocks: python -m hybridkv.bench.breakeven)


class ObjRef(NamedTuple):
    kind: str
    group: str
    block: int


def block_refs(kind, group, ids):
    """Block id -> the pool's one ObjRef for it (a list), every one made with the pool and
    kept: the index, the evictor and the launches share it (no per-use tuple), and the garbage
    collector finds them in the start-up heap (an engine freezes it, as vLLM's does with its
    block objects), not piling up in the old generation as block ids are first used.  ``ids``:
    the pool's block id objects (``Pool.ids``), so ``ref.block`` is the same int object."""
    return list(map(partial(tuple.__new__, ObjRef), zip(repeat(kind), repeat(group), ids)))


class Pool:
    pages_per_block = 1       # arena sub-pages a block spans (hybridkv.cache.arena_pool.ArenaPool)

    def __init__(self, kind, group, num_blocks, tensors, abi, ctx, device="cpu", checked=False,
                 on_transition=None):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise BadArgument("num_blocks must be a positive int", num_blocks)
        self.kind, self.group, self.n = kind, group.name, num_blocks
        self.n_layers = len(group.layers)
        self.rec_type, self.table = REC[kind], table_for(MACHINE[kind])
        self.ctx, self.checked, self.on_transition = ctx, checked, on_transition
        self.run_min = RUN_MIN    # fire_run batches runs at least this long
        self.data = self._make_storage(tensors, group.dtype, device)
        self.block_nbytes = sum(self.n_layers * slot_bytes(r, d, group.dtype)
                                for r, d in tensors.values())
        self._first = next(iter(self.data.values()))
        self.holds_bytes = not self._first.is_meta    # meta: bookkeeping only, no bytes to move
        self._tensor_bytes = {name: t[:, 0].numel() * t.element_size()
                              for name, t in self.data.items()}
        self._rows = {name: (t.shape[2], t[:, 0, 0].numel() * t.element_size())
                      for name, t in self.data.items()}       # rows a slot has, bytes a row
        self._base = self._first.data_ptr()
        self._slot_bytes = self._first.stride(1) * self._first.element_size()   # slot stride
        self.slots_aligned = bool(np.all(can_hit_bytes(           # layer 4, once per slot
            self._base + np.arange(self._first.shape[1], dtype=np.int64) * self._slot_bytes,
            self.block_nbytes, GPU_BLOCK_ALIGN)))
        self.ids = list(range(num_blocks))     # block -> its one int object: the free list,
        #                                        the refs and every set or dict that stores a
        #                                        block id hold it, so probes stop at the
        #                                        identity test
        self.refs = block_refs(kind, self.group, self.ids)  # block -> its ObjRef
        self.phys = list(self.ids)
        self.spare = num_blocks
        self._abi, self.abi_uniform = abi, True
        self.abi_of = [abi] * num_blocks
        self._abi_verdicts = {}   # (guard, stored ABI, pool ABI) -> its verdict (abi_ok)
        self.recs = RecordColumns(self.rec_type, num_blocks)
        self.free = self.ids[::-1]             # stack; stale entries skipped
        self.is_free = bytearray(b"\x01") * num_blocks
        self.n_free, self.n_writing = num_blocks, 0
        self.shadows = [CheckedMachine(self.table) for _ in range(num_blocks)] if checked else None
        self.touched = set()      # checked mode: blocks changed since the last check
        self.watch, self.on_ready = set(), None   # on_ready(b) once a watched b lands READY

    # -- data -------------------------------------------------------------------------------
    def _make_storage(self, tensors, dtype, device):
        """name -> ``[n_layers, slots, rows, dim]``: this pool's own tensors, one spare slot
        (hybridkv.cache.arena_pool.ArenaPool draws its slots from the arena instead)."""
        return {name: storage(self.n_layers, self.n + 1, rows, dim, dtype, device)
                for name, (rows, dim) in tensors.items()}

    def layer(self, name, j):
        """Layer j's view ``[slots, rows, dim]`` of tensor ``name`` (what kernels read)."""
        return self.data[name][j]

    def slot(self, b):
        """Physical slot of block b: the id a block table holds for the kernels."""
        return self.phys[b]

    def addr(self, b):
        """Address of block b's rows in layer 0 (every layer's start is aligned alike)."""
        return self._base + self.phys[b] * self._slot_bytes

    def abi_ok(self, guard, stored):
        """Funnel layer 2 for an object stored under ABI ``stored``: ``guard(stored,
        self.abi)`` (spec.funnel.can_hit_abi, a pure predicate of two values), asked once per
        distinct pair and guard, kept for the pool's life: every lookup meets the same few."""
        key = (guard, stored, self._abi)
        verdict = self._abi_verdicts.get(key)
        if verdict is None:
            verdict = self._abi_verdicts[key] = bool(guard(stored, self._abi))
        return verdict

    @property
    def abi(self):
        """The ABI the pool's kernels expect now (each block keeps the one it was written
        under: ``abi_of``)."""
        return self._abi

    @abi.setter
    def abi(self, abi):
        """A new ABI (set_kernel_version): ``abi_uniform`` no longer vouches for abi_of."""
        if abi != self._abi:
            self.abi_uniform = False
        self._abi = abi

    def bytes_ok(self, b):
        """Funnel layer 4 for one block: address and length on the GPU block alignment."""
        return can_hit_bytes(self.addr(b), self.block_nbytes, GPU_BLOCK_ALIGN)

    def bytes_ok_run(self, blocks):
        """``bytes_ok`` of each of ``blocks`` as one numpy column (the same spec predicate);
        True alone when the predicate held for every slot of the pool (``slots_aligned``,
        found at construction: a block's address is its slot's, so each verdict is that)."""
        if self.slots_aligned:
            return True
        phys = np.fromiter(map(self.phys.__getitem__, blocks), np.int64, len(blocks))
        return can_hit_bytes(self._base + phys * self._slot_bytes, self.block_nbytes,
                             GPU_BLOCK_ALIGN)

    def copy(self, dst, src):
        """Block src's rows (every tensor, every layer) into block dst; returns bytes copied
        (on the meta device, where no tensor holds bytes, nothing moves)."""
        if self.holds_bytes:
            s, d = self.phys[src], self.phys[dst]
            for t in self.data.values():
                t[:, d].copy_(t[:, s])
        return self.block_nbytes

    def copy_tensor(self, dst, src, name):
        """Only tensor ``name`` of block src into block dst; returns bytes copied."""
        if self.holds_bytes:
            t = self.data[name]
            t[:, self.phys[dst]].copy_(t[:, self.phys[src]])
        return self._tensor_bytes[name]

    def copy_rows(self, dst, src, name, lo, hi):
        """Rows [lo, hi) of tensor ``name`` of block src into the same rows of block dst."""
        if self.holds_bytes:
            t = self.data[name]
            t[:, self.phys[dst], lo:hi].copy_(t[:, self.phys[src], lo:hi])
        rows, row_bytes = self._rows[name]
        return row_bytes * len(range(rows)[lo:hi])

    def to_bytes(self, b):
        """A new uint8 tensor holding block b's rows (every tensor, every layer): a spill.
        One copy: each tensor's rows land straight in their slice of the output."""
        s, off = self.phys[b], 0
        out = torch.empty(self.staged_nbytes, dtype=torch.uint8)
        for t in self.data.values():
            view = t[:, s]
            n = view.numel() * view.element_size()
            out[off:off + n].view(t.dtype).view(view.shape).copy_(view)
            off += n
        return out

    def from_bytes(self, b, raw):
        """Write ``to_bytes``' layout back into block b (a verified load)."""
        s, off = self.phys[b], 0
        for t in self.data.values():
            view = t[:, s]
            n = view.numel() * view.element_size()
            view.copy_(raw[off:off + n].view(t.dtype).view(view.shape))
            off += n

    @property
    def staged_nbytes(self):
        """Length of ``to_bytes`` (dense rows, no padding)."""
        return sum(t[:, 0].numel() * t.element_size() for t in self.data.values())

    # -- transitions --------------------------------------------------------------------------
    def target(self, b, event):
        rec = self.recs[b]
        return self.table.target(rec.st, event, rec, self.ctx)

    def accepted(self, blocks, event):
        """How many of ``blocks``, from the first, the table lets ``event`` fire on (each from
        its own record): the run ``fire_run`` then fires without a refusal."""
        if len(blocks) >= self.run_min:
            _, o = self.recs.gather(blocks)
            refused = self.table.target_many(o.st, event, o, self.ctx) < 0
            return int(np.argmax(refused)) if refused.any() else len(blocks)
        for i, b in enumerate(blocks):
            if self.target(b, event) is None:
                return i
        return len(blocks)

    def fire(self, b, event, *args):
        """Table transition + the spec's effect on block b; raises TransitionRefused and
        changes nothing when the table refuses."""
        rec, cx = self.recs[b], self.ctx
        tgt = self.table.fire(rec.st, event, rec, cx)
        new = EFFECTS[event](rec, cx, *args)
        if tgt != rec.st:                       # st is every record's first field
            new = tuple.__new__(self.rec_type, (tgt, *new[1:]))
            self._check_move(b, rec.st, tgt)
        self._landed(b, event, rec, new)
        return new

    def fire_run(self, blocks, event, *args, distinct=False):
        """``fire`` on each of ``blocks`` in order (``args``: scalars, or lists of one value per
        block); the new records are in ``recs`` (read them with ``recs.values``).  A run of
        ``run_min`` or more distinct blocks is one gather of their rows, each guard and the
        effect called once over the columns, one scatter; a refused block raises
        TransitionRefused and changes nothing.  Checked mode shadows every block.
        ``distinct``: the caller found ``blocks`` distinct (not checked again)."""
        n = len(blocks)
        if n < self.run_min or not distinct and len(set(blocks)) != n:
            fire = self.fire
            if not args:                            # most short runs: one or two blocks
                for b in blocks:
                    fire(b, event)
                return
            for i, b in enumerate(blocks):
                fire(b, event, *[a[i] if isinstance(a, list) else a for a in args])
            return
        cx = self.ctx
        idx, o = self.recs.gather(blocks)
        tgts = self.table.target_many(o.st, event, o, cx)
        if (tgts < 0).any():
            st = int(o.st[int(np.argmax(tgts < 0))])
            raise TransitionRefused(self.table.name, self.table.states.get(st, st), event)
        self._check_move_run(blocks, o.st, tgts)
        col_args = [np.asarray(a) if isinstance(a, list) else a for a in args]
        new = EFFECTS[event](o, cx, *col_args)._replace(st=tgts)
        self.recs.scatter(idx, new, o)
        self._landed_run(blocks, event, o, new, idx)

    def _check_move(self, b, old, new):
        """Block b may leave state ``old`` for ``new`` beyond what the table says (checked
        before anything changes; a refusal raises and changes nothing): nothing more here,
        ArenaPool checks the pages the move takes or gives."""

    def _check_move_run(self, blocks, olds, news):
        """``_check_move`` of each of ``blocks`` (``olds`` / ``news``: state columns)."""

    def _landed(self, b, event, old, new):
        """Block b went from ``old`` to ``new`` by ``event``: shadow, free lists, metrics."""
        if self.shadows is not None:
            self.shadows[b].follow(old.st, event, old, self.ctx, new.st)
            self.touched.add(b)
        self.recs.put(b, new)
        if old.st != new.st:
            self._moved(b, old.st, new.st)
        if self.on_transition is not None:
            self.on_transition(self.kind, old.st, new.st)
        if new.st == READY and b in self.watch:
            self.watch.discard(b)
            self.on_ready(b)

    def _landed_run(self, blocks, event, olds, news, idx):
        """``_landed`` of a run whose rows are written already, ``olds`` / ``news`` its records
        as columns, ``idx`` the blocks as an int64 array: the bookkeeping per distinct
        (from, to) pair of states, not per block."""
        if self.shadows is not None:
            n, cx, make = len(blocks), self.ctx, self.rec_type._make
            old_rows = zip(*olds)
            new_rows = zip(*(np.broadcast_to(f, (n,)).tolist() for f in news))
            for b, old, new in zip(blocks, old_rows, new_rows):
                old, new = make(map(int, old)), make(new)
                self.shadows[b].follow(old.st, event, old, cx, new.st)
            self.touched.update(blocks)
        pairs = olds.st * 8 + news.st
        kinds = distinct(pairs)
        for pair in kinds:
            a, z = divmod(pair, 8)
            members = blocks if len(kinds) == 1 else idx[pairs == pair].tolist()
            if a != z:
                self._moved_run(members, a, z)
            if self.on_transition is not None:
                self.on_transition(self.kind, a, z, len(members))
            if z == READY and self.watch:
                for b in members:
                    if b in self.watch:
                        self.watch.discard(b)
                        self.on_ready(b)

    def _moved(self, b, old, new):
        if old == WRITING:
            self.n_writing -= 1
        if new == WRITING:
            self.n_writing += 1
        if old == FREE:
            self.is_free[b] = 0
            self.n_free -= 1
        if new == FREE:
            self.is_free[b] = 1
            self.n_free += 1
            self.free.append(self.ids[b])
            self.abi_of[b] = self._abi

    def _moved_run(self, blocks, old, new):
        """``_moved`` of each of ``blocks`` (distinct), all from state ``old`` to ``new``: the
        counters and free flags at once."""
        n = len(blocks)
        self.n_writing += ((new == WRITING) - (old == WRITING)) * n
        if old == FREE or new == FREE:
            np.frombuffer(self.is_free, dtype=np.uint8)[np.asarray(blocks)] = new == FREE
            self.n_free += n if new == FREE else -n
        if new == FREE:
            self.free.extend(map(self.ids.__getitem__, blocks))
            abi_of, abi = self.abi_of, self._abi
            for b in blocks:
                abi_of[b] = abi

    def alloc(self):
        """A FREE block id (still FREE until its first event), or None."""
        free, is_free = self.free, self.is_free
        while free:
            b = free[-1]
            if is_free[b]:
                return b
            free.pop()
        return None

    def alloc_run(self, n):
        """n FREE block ids, the ones n rounds of ``alloc`` + ``write`` would take, in that
        order (still FREE until written: ``write_run``); fewer when fewer are free."""
        free, is_free = self.free, self.is_free
        if 0 < n <= len(free):                 # the stack's top n, when all free and distinct
            out = free[len(free) - n:][::-1]
            if all(map(is_free.__getitem__, out)) and len(set(out)) == n:
                del free[len(free) - n:]
                return out
        out, taken = [], set()
        while len(out) < n and free:
            b = free.pop()
            if is_free[b] and b not in taken:
                out.append(b)
                taken.add(b)
        return out

    def write(self, b, p, draft=0):
        """FREE -> WRITING at position p (a draft with ``draft=1``); records the ABI."""
        self.abi_of[b] = self._abi
        return self.fire(b, "draft" if draft else "write", p, draft)

    def write_run(self, blocks, positions, draft=0):
        """``write`` of each block at its position, as one run (``fire_run``)."""
        abi_of, abi = self.abi_of, self._abi
        for b in blocks:
            abi_of[b] = abi
        self.fire_run(blocks, "draft" if draft else "write", list(positions), draft)

    def touch(self, b):
        """Checked mode: block b's bookkeeping (index, policy) changed without an event."""
        if self.shadows is not None:
            self.touched.add(b)

    def touch_run(self, blocks):
        """``touch`` of each of ``blocks``."""
        if self.shadows is not None:
            self.touched.update(blocks)

    def relocate(self, b):
        """Move block b's rows to the spare slot (its address changes), spec ``relocate``."""
        rec = self.recs[b]
        self.table.fire(rec.st, "relocate", rec, self.ctx)      # refuse before copying
        old, new = self.phys[b], self._fresh_slot(b, rec.st)
        for t in self.data.values():
            t[:, new].copy_(t[:, old])
        self.phys[b] = new
        self._retire_slot(b, old)
        return self.fire(b, "relocate")

    def _fresh_slot(self, b, st):
        """The slot block b's relocation moves to: the spare."""
        return self.spare

    def _retire_slot(self, b, slot):
        """The slot a relocation left becomes the spare."""
        self.spare = slot

    def load_records(self, recs):
        """Replace every block's spec record (e.g. an abstract start state) and rebuild the
        free list, counters and checked-mode shadows from them."""
        if len(recs) != self.n or any(type(r) is not self.rec_type for r in recs):
            raise BadArgument("records do not fit this pool", (self.kind, len(recs)))
        self.recs.load(recs)
        self.is_free = bytearray(r.st == FREE for r in recs)
        self.free = [b for b in self.ids[::-1] if recs[b].st == FREE]
        self.n_free, self.n_writing = len(self.free), sum(r.st == WRITING for r in recs)
        if self.shadows is not None:
            self.shadows = [CheckedMachine(self.table) for _ in recs]
            for sh, r in zip(self.shadows, recs):
                sh.sm.current_state_value = r.st
        self.touched.update(range(self.n))

    # -- integrity ------------------------------------------------------------------------------
    def check_integrity(self):
        """Problems found (empty list = sound): free bookkeeping, counters, slots, blocks."""
        bad = []
        sts = self.recs.cols[:, 0]
        free_now = np.flatnonzero(sts == FREE).tolist()
        if len(free_now) != self.n_free:
            bad.append(("n_free", self.n_free, len(free_now)))
        if not set(free_now) <= set(self.free):
            bad.append(("free-list", sorted(set(free_now) - set(self.free))))
        n_w = int((sts == WRITING).sum())
        if n_w != self.n_writing:
            bad.append(("n_writing", self.n_writing, n_w))
        return bad + self._check_slots() + self.check_blocks(range(self.n))

    def _check_slots(self):
        """Every slot is one block's or the spare, once."""
        if sorted(self.phys + [self.spare]) != list(range(self.n + 1)):
            return [("phys", self.phys, self.spare)]
        return []

    def check_blocks(self, blocks):
        """Problems of single blocks (checked mode checks the touched ones after each call):
        free flag, pins, a FREE record's fields, counter bounds, address, shadow machine."""
        bad, recs, cx = [], self.recs, self.ctx
        for b in blocks:
            r = recs[b]
            if (r.st == FREE) != bool(self.is_free[b]):
                bad.append(("free-flag", b, r.st))
            if (r.st == PINNED) != (r.pins >= 1) or r.pins < 0:
                bad.append(("pins", b, r))
            if r.st == FREE and (r.draft or r.pins or r.pub):
                bad.append(("free-record", b, r))
            if r.ver > cx.max_ver or r.ep > cx.max_ep:
                bad.append(("counter", b, r))
            if self.phys[b] == self.spare or not self.bytes_ok(b):
                bad.append(("align", b, self.addr(b)))
            if self.shadows is not None and self.shadows[b].sm.current_state_value != r.st:
                bad.append(("shadow", b, r.st))
        return bad
