"""State routing over the block arena (issue 19): the encoding agrees with the concrete step,
the invariants are proven (BMC + 1-induction), and the proof fails where it must: every guard
conjunct's mutant and two seeded bugs in the composed step are found with a trace that
replays on plain ints."""
import random

import pytest
import z3

from spec import arena, arena_system
from spec.arena_system import INVARIANTS, PARAMS, ArenaConfig, action, domains, initial, moves

from proofs import trace as tr
from proofs.arena import ArenaEncoding, mutate_arena, prove_arena, replay
from proofs.bmc import run_bmc
from proofs.encode import flatten
from proofs.mutate import applied, mutants

# a module fixture is built once per xdist worker: the whole module runs on one (loadgroup)
pytestmark = pytest.mark.xdist_group("test_arena_proof")

C = ArenaConfig()


def _actions(c):
    out = []
    for j, (kind, _) in enumerate(c.pools):
        for event in sorted(moves(kind)):
            params = PARAMS[action(kind, event)]
            doms = domains(c)
            for vals in _product([doms[a] for a in params]):
                out.append((event, (j, *vals)))
    return out


def _product(doms):
    out = [()]
    for d in doms:
        out = [t + (x,) for t in out for x in d]
    return out


def _walk(c, n, seed):
    rng = random.Random(seed)
    s, acts, seen = initial(c), _actions(c), []
    for _ in range(n):
        seen.append(s)
        s = arena_system.step(s, c, *rng.choice(
            [a for a in acts if arena_system.step(s, c, *a)[0]]))[1]
    return seen


@pytest.fixture(scope="module")
def enc():
    return ArenaEncoding(C)


def test_symbolic_step_agrees_with_concrete_step(enc):
    """Every encoded instance, on concrete states and arguments, gives spec.arena_system's
    (enabled, next state), enabled or not."""
    rng, checked = random.Random(3), 0
    for s in _walk(C, 40, seed=1)[::5]:
        sub = list(zip(enc.cur, [z3.BitVecVal(x, enc.w) for x in flatten(s)]))
        for event, args in rng.sample(_actions(C), 30):
            j = next(n for n, ins in enumerate(enc.inst)
                     if ins.name == event and ins.args[0] == args[0])
            bind = sub + [(enc.argvars[a], z3.BitVecVal(v, enc.w))
                          for a, v in zip(enc.inst[j].args[1:], args[1:])]
            en, s2 = arena_system.step(s, C, event, args)
            assert z3.is_true(z3.simplify(z3.substitute(enc.enabled[j], *bind))) == bool(en)
            nxt = list(flatten(s))
            for n, ch in enumerate(enc.changes):
                for jj, x in ch:
                    if jj == j:
                        nxt[n] = z3.simplify(z3.substitute(x, *bind)).as_long()
            assert nxt == flatten(s2), (event, args)
            checked += 1
    assert checked >= 200


def test_invariants_hold_on_random_runs():
    """The concrete model: every page taken and given, the invariants after each step."""
    states = _walk(C, 300, seed=5)
    assert any(p.st == arena.PAGE_OWNED for s in states for p in s.pages)
    assert all(f(s, C) for s in states for f in INVARIANTS.values())


def test_routing_proven_by_bmc_and_induction():
    rows, traces = prove_arena(C, depth=3)
    assert {r["name"] for r in rows} == set(INVARIANTS)
    for r in rows:
        assert (r["result"], r["inductive"], r["depth"]) == ("proven", True, 3), r
    assert traces == []


@pytest.fixture(scope="module")
def killed():
    return {r.mutant.name: r for r in mutate_arena(C, depth=5)}


def test_every_guard_conjunct_matters(killed):
    """take from an owned page (a retype while held), give by another kind, by another
    group's pool, by another block of the pool: each found by BMC from the initial state."""
    assert set(killed) == {m.name for m in mutants(arena.GUARDS)} == {
        "arena.can_take#0", "arena.can_give#0", "arena.can_give#1", "arena.can_give#2"}
    for name, r in killed.items():
        assert r.killed and r.how == "bmc" and r.invariant in INVARIANTS, (name, r.how)


@pytest.mark.parametrize("name", ["arena.can_take#0", "arena.can_give#1", "arena.can_give#2"])
def test_mutant_trace_replays_and_the_real_guard_refuses_it(killed, name):
    r = killed[name]
    text = tr.format_trace(r.trace)
    assert f"under mutant {name}" in text and r.invariant in text
    with applied(r.mutant, arena.GUARDS):
        ok, broken = replay(r.trace)
        assert ok and r.invariant in broken           # a real run of the mutant breaks it
    ok, broken = replay(r.trace)
    assert not ok and broken == []                    # the spec's guard refuses a step of it


def _seeded_trace(depth=4):
    enc = ArenaEncoding(C)
    res = run_bmc(enc, INVARIANTS, depth, stop_at_first=True)
    broken = [x for x in res.invariants if x.violated]
    assert broken, "the seeded bug was not found"
    return broken[0]


def test_seeded_alloc_without_a_page_is_found(monkeypatch):
    """Seeded bug: a block leaves FREE without taking a page (the take is skipped)."""
    monkeypatch.setattr(arena_system, "_take", lambda s, c, j, b, p: (True, s))
    found = _seeded_trace()
    assert found.name == "arena_routing" and len(found.trace["steps"]) == 1
    assert found.trace["steps"][0]["action"] in ("write", "draft", "load_start")
    assert replay(found.trace) == (True, ["arena_routing", "arena_accounting"])


def test_seeded_give_that_keeps_the_page_is_found(monkeypatch):
    """Seeded bug: a block returns to FREE but its page stays OWNED (a leak)."""
    monkeypatch.setattr(arena_system, "give", lambda page: page)
    found = _seeded_trace()
    assert found.name in ("arena_routing", "arena_accounting")
    assert [s["action"] for s in found.trace["steps"]][-1] in (
        "reject", "evict", "load_bad", "drop_stale", "relocate")
    ok, broken = replay(found.trace)
    assert ok and found.name in broken
    monkeypatch.undo()
    assert replay(found.trace) == (True, [])          # the real give frees the page


def test_prove_command_shows_the_arena_rows_and_mutants():
    """`hybridkv prove` (hybridkv/commands/prove.py): the arena's rows at the run's depth beside
    the system's invariants, its mutants beside theirs, in the table and the JSON."""
    from hybridkv.commands.prove import _table, _with_arena
    from proofs.run import Report, Settings
    report = Report([], [], [], {}, {}, [])
    _with_arena(report, Settings(depth=2, only=("arena.can_take#0",)), lambda *_: None)
    assert [(r["name"], r["depth"], r["result"]) for r in report.invariants] == [
        (n, 2, "proven") for n in INVARIANTS]
    (m,) = report.mutations
    assert m.killed and m.mutant.name == "arena.can_take#0"
    text = _table(report)
    assert "arena_routing" in text and "mutants killed 1/1" in text
    assert report.as_json()["mutations"] == {"killed": 1, "total": 1, "survivors": []}
