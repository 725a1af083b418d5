"""Auxiliary invariants that make the spec's invariants inductive: they are facts about the
system and live in ``spec.aux_facts``; this module re-exports them for the proof code."""
from spec.aux_facts import AUX, copies_complete, ranges, refs_current, swa_interval

__all__ = ["AUX", "copies_complete", "ranges", "refs_current", "swa_interval"]
