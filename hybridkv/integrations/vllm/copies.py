"""hybridkv's snapshot copies -> vLLM's ``KVCacheBlockCopy`` list (the worker moves the bytes).

hybridkv copies two kinds of window state, and vLLM's worker must make the same copies in its
KV tensors (``copy_kv_cache_blocks_inplace`` gathers every source, then scatters, before the
step's forward):

  capture   ``CacheManager.commit`` ending on a checkpoint P copies the request's window pages
            into P's snapshot (``SlotCopy``, row ranges per page).  The adapter captures only
            positions scheduled in earlier steps, so the copy, run before this step's forward,
            reads computed rows.
  restore   a hit's first allocation copies the snapshot at H into the request's new window
            pages (``Allocation.copies``).

A restore whose snapshot was captured in this same batch would gather the snapshot's rows
before the capture scatters them: its source becomes the capture's source (the same rows,
computed).  Two copies to one destination (a page evicted and reused within the batch): the
later one stands.  Ids: a pool block of a window group spans ``window_blocks`` arena pages (vLLM
ids); row r of it is in its page ``r // block_size``.  A window block holds only the pages its
positions reached and the window has not slid past: a copy moves the pages both blocks hold
(a page the source lacks holds no row any query reads).
"""
from hybridkv.cache.arena import NO_PAGE
from hybridkv.integrations.vllm.block_ids import vllm_id
from hybridkv.integrations.vllm.specs import window_blocks


class WorkerCopies:
    """The copies of the step being scheduled, in vLLM ids: destination id -> source id, in
    the order filed (a later copy to the same destination replaces the earlier one)."""

    def __init__(self, layout, pages_of):
        self.groups = {g.name: g for g in layout.groups}
        self.pages_of = pages_of          # slot -> the block's arena pages
        self.pending = {}                 # destination vLLM id -> source vLLM id

    def _ids(self, group, src, dst, row_start=0, row_end=None, src_pages=(), dst_pages=()):
        """(source, destination) vLLM ids of the pages holding rows [row_start, row_end) of
        the two blocks (their pages as given, else as they are now)."""
        g = self.groups[group]
        last = window_blocks(g) if row_end is None else -(-row_end // g.block_size)
        src_pages, dst_pages = src_pages or self.pages_of(src), dst_pages or self.pages_of(dst)
        return [(vllm_id(src_pages[j]), vllm_id(dst_pages[j]))
                for j in range(row_start // g.block_size, last)
                if src_pages[j] != NO_PAGE and dst_pages[j] != NO_PAGE]

    def captured(self, slot_copies):
        """The SlotCopies a commit returned."""
        for c in slot_copies:
            for src, dst in self._ids(c.group, c.src, c.dst, c.row_start, c.row_end,
                                      c.src_pages, c.dst_pages):
                self.pending.pop(dst, None)
                self.pending[dst] = src

    def restored(self, allocation):
        """A first allocation's snapshot copies (``Allocation.copies``)."""
        for _, group, src_slot, dst_slot in allocation.copies:
            for src, dst in self._ids(group, src_slot, dst_slot):
                self.pending.pop(dst, None)
                self.pending[dst] = self.pending.get(src, src)

    def take(self):
        """(source id, destination id) of every copy filed since the last call."""
        out, self.pending = [(s, d) for d, s in self.pending.items()], {}
        return out
