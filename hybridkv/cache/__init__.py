"""The verified cache manager: pools (the KV memory the kernels read), the prefix index, the
funnel, the writer, snapshots, admission, eviction, the disk link and checked mode."""
from hybridkv.cache.funnel import HitPlan, Read, Rejection
from hybridkv.cache.manager import CacheManager
from hybridkv.cache.pool import ObjRef
from hybridkv.cache.request import Allocation, CheckedTokens, GroupTables

__all__ = ["Allocation", "CacheManager", "CheckedTokens",
           "GroupTables", "HitPlan", "ObjRef", "Read", "Rejection"]
