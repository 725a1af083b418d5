"""vLLM's deferred frees: ``pop_blocks_for_free`` now, ``block_pool.free_blocks`` later.

With overlapping batches and a KV-consumer connector, vLLM's Scheduler does not free a
finished or preempted request's blocks while a step that may still write them is in flight:
it pops the request's bookkeeping (``pop_blocks_for_free``: the request id may come back at
once, e.g. a preempted request rescheduled), keeps the blocks, and hands them back with
``block_pool.free_blocks`` once that step's output is processed.  Freed earlier, a page could
be reallocated and filled by a transfer not ordered against the in-flight write.

hybridkv keeps such a request whole under a ``CacheManager.detach`` handle -- every page it
holds stays held, neither free nor evictable -- and frees the handle when vLLM hands back its
blocks.  This class owns which handle waits for which vLLM block ids.
"""


class DeferredFrees:
    def __init__(self):
        self.handle_of = {}        # vLLM block id -> the detached request holding it
        self.ids_of = {}           # handle -> its vLLM block ids

    def __bool__(self):
        return bool(self.ids_of)

    def hold(self, handle, block_ids):
        """``handle`` (a detached request) waits for ``block_ids`` to come back."""
        ids = set(block_ids)
        self.ids_of[handle] = ids
        for i in ids:
            self.handle_of[i] = handle

    def release(self, block_ids):
        """The handles whose blocks vLLM hands back (any of them: vLLM returns a request's
        list at once), no longer waiting."""
        out = []
        for i in block_ids:
            handle = self.handle_of.get(i)     # None once its handle was released
            if handle is not None:
                for j in self.ids_of.pop(handle):
                    self.handle_of.pop(j, None)
                out.append(handle)
        return out
