"""The engine: continuous batching over one memory, speculative n-gram drafts, the decode graph
guard."""
from hybridkv.engine.drafter import NgramDrafter
from hybridkv.engine.engine import Engine
from hybridkv.engine.graph import DecodeGraph
from hybridkv.engine.scheduler import CannotSchedule, RequestOutput, Scheduler
from hybridkv.engine.verify import cold_logits, cold_mismatches

__all__ = ["CannotSchedule", "DecodeGraph", "Engine", "NgramDrafter", "RequestOutput",
           "Scheduler", "cold_logits", "cold_mismatches"]
