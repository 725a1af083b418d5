"""Disk tier: verified on-disk (or Redis-shared) copies of cache objects."""
from hybridkv.disk.backend import HookedBackend, StorageBackend
from hybridkv.disk.costmodel import Choice, CostDecision, CostModel, FlopsModel, \
    measure_read_bandwidth
from hybridkv.disk.format import (KINDS, BadInput, BadKey, CorruptObject, DiskError,
                                  DiskMeta, OtherVersion, abi_id)
from hybridkv.disk.loader import LoadHandle, LoadResult, LoadStatus
from hybridkv.disk.local import FileOps, LocalBackend
from hybridkv.disk.spill import SpillHandle
from hybridkv.disk.tier import DiskAdmissionRefused, DiskProbe, DiskTier, SpillResult

__all__ = ["DiskTier", "DiskMeta", "DiskProbe", "SpillResult", "SpillHandle", "LoadHandle",
           "LoadResult", "LoadStatus", "DiskAdmissionRefused", "DiskError", "BadInput",
           "BadKey", "CorruptObject", "OtherVersion", "StorageBackend", "HookedBackend",
           "LocalBackend", "FileOps", "CostModel", "FlopsModel", "Choice", "CostDecision",
           "measure_read_bandwidth", "abi_id", "KINDS"]
