"""The V4-mini reference model and the paged cache state it runs against."""
from hybridkv.model.cache import (Checkpoint, CheckpointIncomplete, LayerCheckpoint, PagedCache,
                                  PoolExhausted, SeqState, Tail, validate)
from hybridkv.model.v4mini import V4Mini, V4MiniConfig

__all__ = ["Checkpoint", "CheckpointIncomplete", "LayerCheckpoint", "PagedCache", "PoolExhausted",
           "SeqState", "Tail", "validate", "V4Mini", "V4MiniConfig"]
