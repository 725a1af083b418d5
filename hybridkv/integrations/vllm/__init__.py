"""hybridkv as vLLM 0.33.0's KV cache manager.

``KVCacheManager`` speaks the interface vLLM's ``Scheduler`` uses and translates every call onto
the public API of ``hybridkv.CacheManager``; ``Scheduler`` is vLLM's Scheduler with it installed
(``--scheduler-cls hybridkv.integrations.vllm.Scheduler``); ``layout_from_vllm`` maps a
``KVCacheConfig``'s groups to a ``ModelLayout`` (also ``ModelLayout.from_vllm``).

Importing this package imports no vLLM: the names below load their modules (which import vLLM)
on first access, so ``import hybridkv`` and this package stay usable without vLLM installed.
"""
import importlib

_EXPORTS = {
    "KVCacheManager": "hybridkv.integrations.vllm.manager",
    "Scheduler": "hybridkv.integrations.vllm.scheduler",
    "layout_from_vllm": "hybridkv.integrations.vllm.specs",
    "UnsupportedSpec": "hybridkv.integrations.vllm.specs",
    "vllm_id": "hybridkv.integrations.vllm.block_ids",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
