"""State routing over the block arena for every number of pages and blocks per pool
(proofs.arena_sizes), and that this proof fails where it must: a guard conjunct dropped, or a
seeded leak, and the fact is no longer proven for all sizes."""
import pytest

from spec import arena_system

from proofs.arena_sizes import FACTS, mutate_all_sizes, prove_all_sizes

GIVES = ("evict", "reject", "load_bad", "drop_stale", "relocate")   # the actions that give a page


def test_routing_and_accounting_proven_for_every_size():
    res, built = prove_all_sizes(timeout_ms=30_000)
    assert [(f.name, f.result) for f in res] == [(n, "proven-all-sizes") for n in FACTS]
    assert all(f.detail == "" for f in res) and built > 0


def test_give_by_another_block_is_not_proven_for_every_size():
    (r,) = mutate_all_sizes(timeout_ms=5_000, only=("arena.can_give#2",))
    assert r["result"] == "killed" and r["fact"].startswith("arena_routing"), r
    assert r["fact"].split(" at ")[1].split("@")[0] in GIVES, r       # where the guard acts


def test_seeded_leak_is_not_proven_for_every_size(monkeypatch):
    """Seeded bug: a block returns to FREE but its page stays OWNED."""
    monkeypatch.setattr(arena_system, "give", lambda page: page)
    res, _ = prove_all_sizes(timeout_ms=5_000, stop_at_first=True)
    assert res[0].result == "bounded-only", res
    assert res[0].detail.split(" at ")[1].split("@")[0] in GIVES, res


@pytest.mark.slow
def test_every_guard_conjunct_matters_for_every_size():
    res = mutate_all_sizes(timeout_ms=20_000)
    assert len(res) == 4 and all(r["result"] == "killed" for r in res), res


def test_prove_parametric_command_adds_the_arena_facts(monkeypatch):
    """`hybridkv prove --parametric`: the arena's facts join the system's rows (the system's
    parametric run is stubbed out here; it takes many minutes)."""
    from argparse import Namespace

    from hybridkv.commands import prove
    from proofs import parametric
    monkeypatch.setattr(parametric, "PEncoding", lambda c: None)
    monkeypatch.setattr(parametric, "prove_parametric", lambda *a, **k: ([], 0.0))
    out, ok, muts = prove._parametric(Namespace(fact_timeout=30.0, no_mutation=True, mutant=[],
                                                mutate=False, seed_traces=None),
                                      lambda *_: None)
    assert ok and muts == [] and [(r["name"], r["result"]) for r in out["parametric"]] == [
        (n, "proven-all-sizes") for n in FACTS]
    assert "arena_routing" in prove._parametric_table(out, muts)
