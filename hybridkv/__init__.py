"""hybridkv: KV-cache state management for hybrid-attention LLMs that proves its reuse
decisions safe.  Public face (DESIGN §6); heavy parts are imported lazily."""
import importlib

_EXPORTS = {
    "V4Mini": "hybridkv.model",
    "Engine": "hybridkv.engine",
    "DiskTier": "hybridkv.disk",
    "ModelLayout": "hybridkv.layout",
    "LayerGroup": "hybridkv.layout",
    "CacheManager": "hybridkv.manager",
    "Allocation": "hybridkv.manager",
    "HitPlan": "hybridkv.lookup",
    "Rejection": "hybridkv.lookup",
    **{name: "hybridkv.errors" for name in (
        "AdmissionRefused", "BadTokens", "BadSalt", "UnknownRequest", "CommitPastAllocation",
        "RequestBusy", "DraftsPending", "StaleRead", "InvariantViolation")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridkv' has no attribute {name!r}")
