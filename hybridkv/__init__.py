"""hybridkv: KV-cache state management for hybrid-attention LLMs that proves its reuse
decisions safe.  Public face (DESIGN §6); heavy parts are imported lazily."""
import importlib

_EXPORTS = {
    "V4Mini": "hybridkv.model",
    "Engine": "hybridkv.engine",
    "DiskTier": "hybridkv.disk",
    "ModelLayout": "hybridkv.layout",
    "LayerGroup": "hybridkv.layout",
    "CacheManager": "hybridkv.cache",
    "Allocation": "hybridkv.cache",
    "HitPlan": "hybridkv.cache",
    "Rejection": "hybridkv.cache",
    **{name: "hybridkv.errors" for name in (
        "CacheError", "AdmissionRefused", "RequestTooLarge", "BadArgument", "BadTokens", "BadSalt",
        "UnknownRequest", "CommitPastAllocation", "RequestBusy", "DraftsPending", "StaleRead",
        "Refused", "LayoutError", "InvariantViolation")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridkv' has no attribute {name!r}")
