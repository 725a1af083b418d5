"""Sizes and constants of the abstract system (the prover's and the BFS's parameters)."""
from typing import NamedTuple


class SysConfig(NamedTuple):
    n_obj: int = 2      # objects per memory kind
    n_disk: int = 1     # on-disk prefix slots
    n_req: int = 2      # requests
    n_graph: int = 1    # captured decode graphs
    max_pos: int = 3    # longest prefix (tokens)
    ratio: int = 2      # compression ratio m
    overlap: int = 2    # CSA overlap rows (m for CSA, 0 for HCA)
    window: int = 2     # SWA window W
    chunk: int = 0      # > 0: chunked-local attention, a query reads its own chunk (W = chunk)
    granule: int = 1    # hash granule: GCD of the groups' block sizes
    blk_comp: int = 1   # per-group block sizes (tokens): a group's cached state is reusable
    blk_tail: int = 1   #   at H only on its block boundary or at a checkpoint taken exactly
    blk_swa: int = 1    #   at H (1: every position is a boundary)
    blk_idx: int = 1
    max_ver: int = 2    # version counters never pass this (no wrap, no ABA)
    max_ep: int = 1     # relocation epochs never pass this
    max_iv: int = 1     # indexer versions never pass this
    kabi: int = 0       # this build's kernel ABI id
    cap: int = 2        # admission cap: objects in transit at once
    n_faults: int = 5   # fault kinds injected on disk (payload, header, ABI, offset, torn write)

    @property
    def blocks(self):
        """Block sizes per kind, in ``KINDS`` order."""
        return (self.blk_comp, self.blk_tail, self.blk_swa, self.blk_idx)


class Ctx:
    """What a machine guard reads besides its record: the constants plus the model's
    current indexer version."""

    def __init__(self, cfg, miv):
        self.cfg, self.miv = cfg, miv

    def __getattr__(self, name):
        return getattr(self.cfg, name)
