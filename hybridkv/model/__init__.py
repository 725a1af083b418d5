"""The V4-mini reference model; its KV lives in the CacheManager's pools (one memory)."""
from hybridkv.model.v4mini import SeqWork, V4Mini, V4MiniConfig, tail_start

__all__ = ["SeqWork", "V4Mini", "V4MiniConfig", "tail_start"]
