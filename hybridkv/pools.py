"""Per-(kind, group) pools: a preallocated tensor, a free list and one spec record per block.

Every state change of a block goes through ``Pool.fire``: the compiled table of the kind's
machine (hybridkv.tables) with the spec's guard functions, then the spec's effect function on
the block's own spec record (CompRec / TailRec / SwaRec / IdxRec).  In checked mode a real
python-statemachine instance shadows each block (CheckedMachine).

Relocation is real: blocks are logical ids mapped to physical slots of the tensor (one spare
slot per pool); ``relocate`` copies the data into the spare slot, so the block's address
changes, and fires the spec's ``relocate`` (epoch + 1).
"""
from typing import NamedTuple

import torch

from hybridkv.errors import BadArgument
from hybridkv.tables import CheckedMachine, table_for
from spec.effects import EFFECTS
from spec.common import FREE, PINNED, READY, WRITING
from spec.funnel import GPU_BLOCK_ALIGN, can_hit_bytes
from spec.state import KINDS, MACHINES, RECS

REC = dict(zip(KINDS, RECS))
MACHINE = dict(zip(KINDS, MACHINES))
_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NO_LIMIT = 1 << 62


EFFECT = EFFECTS   # event -> the spec's effect on the record (one map with spec.step)


class ObjRef(NamedTuple):
    kind: str
    group: str
    block: int


class GroupCtx:
    """What a guard reads besides its record (spec.config.Ctx's fields for one group)."""
    __slots__ = ("ratio", "overlap", "window", "max_ver", "max_ep", "miv", "kabi", "blocks")

    def __init__(self, g, max_ver=NO_LIMIT, max_ep=NO_LIMIT, miv=0, kabi=0):
        self.ratio, self.overlap, self.window = g.ratio, g.overlap, g.window
        self.blocks = (g.block_size,) * len(KINDS)     # per kind, in KINDS order
        self.max_ver, self.max_ep, self.miv, self.kabi = max_ver, max_ep, miv, kabi


class Pool:
    def __init__(self, kind, group, num_blocks, shape, abi, ctx, device="cpu", checked=False,
                 on_transition=None):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise BadArgument("num_blocks must be a positive int", num_blocks)
        self.kind, self.group, self.n = kind, group.name, num_blocks
        self.rec_type, self.table = REC[kind], table_for(MACHINE[kind])
        self.ctx, self.checked, self.on_transition = ctx, checked, on_transition
        self.shape, self.dtype = tuple(shape), _DT[group.dtype]
        esize = torch.empty((), dtype=self.dtype).element_size()
        raw = esize * max(1, _prod(shape))
        self.block_nbytes = -(-raw // GPU_BLOCK_ALIGN) * GPU_BLOCK_ALIGN   # padded
        slots = num_blocks + 1                                          # + one spare
        buf = torch.zeros(slots * self.block_nbytes + GPU_BLOCK_ALIGN, dtype=torch.uint8,
                          device=device)
        off = (-buf.data_ptr()) % GPU_BLOCK_ALIGN
        self._buf = buf
        self.slots = buf[off:off + slots * self.block_nbytes].view(slots, self.block_nbytes)
        self.base = self.slots.data_ptr()
        self.phys = list(range(num_blocks))
        self.spare = num_blocks
        self.abi, self.abi_of = abi, [abi] * num_blocks
        self.recs = [self.rec_type() for _ in range(num_blocks)]
        self.free = list(range(num_blocks - 1, -1, -1))   # stack; stale entries skipped
        self.is_free = bytearray(b"\x01") * num_blocks
        self.n_free, self.n_writing = num_blocks, 0
        self.shadows = [CheckedMachine(self.table) for _ in range(num_blocks)] if checked else None
        self.touched = set()      # checked mode: blocks changed since the last check
        self.watch, self.on_ready = set(), None   # on_ready(b) once a watched b lands READY

    # -- data -------------------------------------------------------------------------------
    def view(self, b):
        """The block's tensor (shape ``self.shape``) at its current physical slot."""
        raw = self.slots[self.phys[b]][: _prod(self.shape) * self.dtype.itemsize]
        return raw.view(self.dtype).view(self.shape)

    def addr(self, b):
        return self.base + self.phys[b] * self.block_nbytes

    def bytes_ok(self, b):
        """Funnel layer 4 for one block: address and length on the GPU block alignment."""
        return can_hit_bytes(self.addr(b), self.block_nbytes, GPU_BLOCK_ALIGN)

    # -- transitions --------------------------------------------------------------------------
    def target(self, b, event):
        rec = self.recs[b]
        return self.table.target(rec.st, event, rec, self.ctx)

    def fire(self, b, event, *args):
        """Table transition + the spec's effect (EFFECT) on block b; raises
        TransitionRefused and changes nothing when the table refuses."""
        rec, cx = self.recs[b], self.ctx
        tgt = self.table.fire(rec.st, event, rec, cx)
        effect = EFFECT[event]
        new = (effect(rec, cx, *args) if effect is not None else rec)._replace(st=tgt)
        if self.shadows is not None:
            self.shadows[b].follow(rec.st, event, rec, cx, tgt)
            self.touched.add(b)
        self.recs[b] = new
        if rec.st != tgt:
            self._moved(b, rec.st, tgt)
        if self.on_transition is not None:
            self.on_transition(self.kind, rec.st, tgt)
        if tgt == READY and b in self.watch:
            self.watch.discard(b)
            self.on_ready(b)
        return new

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
            self.free.append(b)
            self.abi_of[b] = self.abi

    def alloc(self):
        """A FREE block id (still FREE until its first event), or None."""
        free, is_free = self.free, self.is_free
        while free:
            b = free[-1]
            if is_free[b]:
                return b
            free.pop()
        return None

    def alloc_many(self, k):
        out, seen = [], set()
        for b in reversed(self.free):
            if len(out) == k:
                break
            if self.is_free[b] and b not in seen:
                seen.add(b)
                out.append(b)
        return out if len(out) == k else None

    def write(self, b, p, draft=0):
        self.abi_of[b] = self.abi
        return self.fire(b, "draft" if draft else "write", p, draft)

    def touch(self, b):
        """Checked mode: block b's bookkeeping (index, policy) changed without an event."""
        if self.shadows is not None:
            self.touched.add(b)

    def relocate(self, b):
        """Move block b's data to the spare slot (address changes), spec ``relocate``."""
        rec = self.recs[b]
        self.table.fire(rec.st, "relocate", rec, self.ctx)      # refuse before copying
        old = self.phys[b]
        self.slots[self.spare].copy_(self.slots[old])
        self.phys[b], self.spare = self.spare, old
        return self.fire(b, "relocate")

    def load_records(self, recs):
        """Replace every block's spec record (e.g. an abstract start state) and rebuild the
        free list, counters and checked-mode shadows from them."""
        if len(recs) != self.n or any(type(r) is not self.rec_type for r in recs):
            raise BadArgument("records do not fit this pool", (self.kind, len(recs)))
        self.recs = list(recs)
        self.is_free = bytearray(r.st == FREE for r in recs)
        self.free = [b for b in range(self.n - 1, -1, -1) if recs[b].st == FREE]
        self.n_free, self.n_writing = len(self.free), sum(r.st == WRITING for r in recs)
        if self.shadows is not None:
            self.shadows = [CheckedMachine(self.table) for _ in recs]
            for sh, r in zip(self.shadows, recs):
                sh.sm.current_state_value = r.st
        self.touched.update(range(self.n))

    # -- integrity ------------------------------------------------------------------------------
    def check_integrity(self):
        """Problems found (empty list = sound): free bookkeeping, pins, counters, alignment."""
        bad = []
        free_now = [b for b in range(self.n) if self.recs[b].st == FREE]
        if sorted(free_now) != sorted(b for b in range(self.n) if self.is_free[b]):
            bad.append(("free-flags", self.kind, self.group))
        if len(free_now) != self.n_free:
            bad.append(("n_free", self.n_free, len(free_now)))
        if not set(free_now) <= set(self.free):
            bad.append(("free-list", sorted(set(free_now) - set(self.free))))
        n_w = sum(r.st == WRITING for r in self.recs)
        if n_w != self.n_writing:
            bad.append(("n_writing", self.n_writing, n_w))
        if sorted(self.phys + [self.spare]) != list(range(self.n + 1)):
            bad.append(("phys", self.phys, self.spare))
        return bad + self.check_blocks(range(self.n))

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
            if r.st == FREE and (r.draft or r.pins):
                bad.append(("free-record", b, r))
            if r.ver > cx.max_ver or r.ep > cx.max_ep:
                bad.append(("counter", b, r))
            if self.phys[b] == self.spare or not self.bytes_ok(b):
                bad.append(("align", b, self.addr(b)))
            if self.shadows is not None and self.shadows[b].sm.current_state_value != r.st:
                bad.append(("shadow", b, r.st))
        return bad

    def readable_blocks(self):
        return [b for b, r in enumerate(self.recs) if r.st in (READY, PINNED)]


def _prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out
