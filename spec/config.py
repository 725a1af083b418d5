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
    granule: int = 1    # hash granule: GCD of the groups' block sizes
    max_ver: int = 2    # version counters never pass this (no wrap, no ABA)
    max_ep: int = 1     # relocation epochs never pass this
    max_iv: int = 1     # indexer versions never pass this
    kabi: int = 0       # this build's kernel ABI id
    cap: int = 2        # admission cap: objects in transit at once
    n_faults: int = 4   # fault kinds the environment injects on disk (payload, header, ABI, align)


class Ctx:
    """What a machine guard reads besides its record: the constants plus the model's
    current indexer version."""

    def __init__(self, cfg, miv):
        self.cfg, self.miv = cfg, miv

    def __getattr__(self, name):
        return getattr(self.cfg, name)
