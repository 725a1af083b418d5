"""vLLM's Scheduler with hybridkv's KVCacheManager installed.

    vllm serve MODEL --scheduler-cls hybridkv.integrations.vllm.Scheduler

vLLM's Scheduler builds its ``KVCacheManager`` by the name it imported into its own module;
this subclass swaps that name for hybridkv's while its constructor runs (the only place the
manager is built), handing it the scheduler's ``max_num_seqs`` (the running requests a window
pool's share is sized for: hybridkv.integrations.vllm.id_space), and checks that the manager
it got is ours.
"""
import threading
from functools import partial

import vllm.v1.core.sched.scheduler as vllm_scheduler

from hybridkv.integrations.vllm.manager import KVCacheManager

_BUILD_LOCK = threading.Lock()


class Scheduler(vllm_scheduler.Scheduler):
    def __init__(self, *args, **kwargs):
        with _BUILD_LOCK:
            stock = vllm_scheduler.KVCacheManager
            config = kwargs.get("vllm_config", args[0] if args else None)
            seqs = getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)
            vllm_scheduler.KVCacheManager = partial(KVCacheManager, max_num_seqs=seqs)
            try:
                super().__init__(*args, **kwargs)
            finally:
                vllm_scheduler.KVCacheManager = stock
        if not isinstance(self.kv_cache_manager, KVCacheManager):
            raise TypeError(f"vLLM built {type(self.kv_cache_manager).__name__}, "
                            "not hybridkv's KVCacheManager")
