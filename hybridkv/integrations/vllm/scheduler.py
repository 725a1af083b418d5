"""vLLM's Scheduler with hybridkv's KVCacheManager installed.

    vllm serve MODEL --scheduler-cls hybridkv.integrations.vllm.Scheduler

vLLM's Scheduler builds its ``KVCacheManager`` by the name it imported into its own module;
this subclass swaps that name for hybridkv's while its constructor runs (the only place the
manager is built) and checks that the manager it got is ours.  A new request is prepared on
arrival (``add_request``), as vLLM hashes a request's blocks when it is made.
"""
import threading

import vllm.v1.core.sched.scheduler as vllm_scheduler

from hybridkv.integrations.vllm.manager import KVCacheManager

_BUILD_LOCK = threading.Lock()


class Scheduler(vllm_scheduler.Scheduler):
    def __init__(self, *args, **kwargs):
        with _BUILD_LOCK:
            stock = vllm_scheduler.KVCacheManager
            vllm_scheduler.KVCacheManager = KVCacheManager
            try:
                super().__init__(*args, **kwargs)
            finally:
                vllm_scheduler.KVCacheManager = stock
        if not isinstance(self.kv_cache_manager, KVCacheManager):
            raise TypeError(f"vLLM built {type(self.kv_cache_manager).__name__}, "
                            "not hybridkv's KVCacheManager")

    def add_request(self, request):
        """vLLM's ``add_request``; a new request (not a streaming session's next chunk) is
        then prepared on arrival (``KVCacheManager.prepare``: its ids translated and its
        chain keys hashed, as vLLM hashes its blocks when the request is made)."""
        new = request.request_id not in self.requests
        super().add_request(request)
        if new and self.requests.get(request.request_id) is request:
            self.kv_cache_manager.prepare(request)
