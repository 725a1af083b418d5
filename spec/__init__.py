"""hybridkv's executable spec: the single source of truth.

Five cache objects as python-statemachine machines, their dual-mode guards and effects,
the 4-layer hit-validation funnel, the invariants and the whole-system ``step``.
Pure Python: no torch, no I/O.  Registries for tools: MACHINES, GUARDS, ACTIONS, INVARIANTS,
AUX (the auxiliary invariants induction needs).
"""
import inspect

from spec import common, compressed, disk, funnel, indexer, swa, system, tail
from spec.aux_facts import AUX
from spec.config import SysConfig
from spec.invariants import INVARIANTS
from spec.state import KINDS, initial
from spec.step import actions, step
from spec.system import ACTIONS

MACHINES = {"compressed": compressed.CompressedKVMachine,
            "tail": tail.UncompressedTailMachine,
            "swa": swa.SwaWindowMachine,
            "indexer": indexer.IndexerMachine,
            "disk": disk.DiskPrefixMachine}


def _guards():
    mods = (common, compressed, tail, swa, indexer, disk, funnel, system)
    return {f"{mod.__name__.split('.')[-1]}.{name}": fn
            for mod in mods for name, fn in inspect.getmembers(mod, inspect.isfunction)
            if name.startswith("can_") if fn.__module__ == mod.__name__}


GUARDS = _guards()

__all__ = ["ACTIONS", "AUX", "GUARDS", "INVARIANTS", "KINDS", "MACHINES", "SysConfig", "actions",
           "initial", "step"]
