"""The engine: continuous batching, speculative n-gram drafts, the decode graph guard."""
from hybridkv.engine.ckpts import CheckpointStore, chain_key
from hybridkv.engine.drafter import NgramDrafter
from hybridkv.engine.engine import Engine
from hybridkv.engine.graph import DecodeGraph
from hybridkv.engine.scheduler import CannotSchedule, RequestOutput, Scheduler
from hybridkv.engine.verify import cold_mismatches

__all__ = ["CannotSchedule", "CheckpointStore", "DecodeGraph", "Engine", "NgramDrafter",
           "RequestOutput", "Scheduler", "chain_key", "cold_mismatches"]
