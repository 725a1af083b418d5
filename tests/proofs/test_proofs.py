"""Fast tier of the Z3 proofs (issue 3): encoding vs concrete step, induction, BMC, the
mutation machinery and the CLI.  The deep tier lives in test_proofs_deep.py (slow)."""
import json
import random
import subprocess
import sys

import pytest
import z3

import spec
from spec import INVARIANTS, initial, step
from spec.step import actions

from proofs import search
from proofs import trace as tr
from proofs.aux import AUX
from proofs.bmc import run_bmc
from proofs.encode import Encoding, flatten
from proofs.induction import induction_step
from proofs.mutate import Mutant, MutantError, applied, find, mutants
from proofs.run import FAST

# a module fixture is built once per xdist worker: the whole module runs on one (loadgroup)
pytestmark = pytest.mark.xdist_group("test_proofs")


@pytest.fixture(scope="module")
def enc():
    return Encoding(FAST)


def _walk(c, n, seed):
    """A concrete random run of enabled actions; returns the states visited."""
    rng = random.Random(seed)
    s, out, acts = initial(c), [], actions(c)
    for _ in range(n):
        out.append(s)
        en = [a for a in acts if step(s, c, *a)[0]]
        s = step(s, c, *rng.choice(en))[1]
    return out


def test_symbolic_step_agrees_with_concrete_step(enc):
    """Every encoded action instance, evaluated on a concrete state with concrete
    arguments, gives exactly spec.step's (enabled, next state)."""
    c = FAST
    states = _walk(c, 25, seed=1)[::4]
    rng = random.Random(2)
    checked = 0
    for s in states:
        sub = list(zip(enc.cur, [z3.BitVecVal(x, enc.w) for x in flatten(s)]))
        for name, args in rng.sample(actions(c), 40):
            en_c, s2 = step(s, c, name, args)
            cands = [j for j, ins in enumerate(enc.inst) if ins.name == name]
            # pick the instance whose concrete arguments match, bind the symbolic ones
            for j in cands:
                ins = enc.inst[j]
                bind, ok = list(sub), True
                for a, v in zip(ins.args, args):
                    if isinstance(a, str):
                        for var, x in zip(_tup(enc.argvars[a]), _tup(v)):
                            bind.append((var, z3.BitVecVal(x, enc.w)))
                    elif a != v:
                        ok = False
                if not ok:
                    continue
                en_s = z3.simplify(z3.substitute(enc.enabled[j], *bind))
                assert z3.is_true(en_s) == bool(en_c), (name, args)
                if en_c:
                    nxt = list(flatten(s))
                    for n, ch in enumerate(enc.changes):
                        for jj, x in ch:
                            if jj == j:
                                nxt[n] = z3.simplify(z3.substitute(x, *bind)).as_long()
                    assert nxt == flatten(s2), (name, args)
                checked += 1
    assert checked > 100


def _tup(x):
    return x if isinstance(x, tuple) else (x,)


def test_strengthening_is_inductive(enc):
    props = {**INVARIANTS, **AUX}
    assert all(p(initial(FAST), FAST) for p in props.values())
    res = induction_step(enc, props, 1)
    bad = [(r.name, tr.format_trace(r.cti)) for r in res if not r.inductive]
    assert not bad, bad


def test_well_formed_alone_is_not_inductive(enc):
    """The auxiliary facts are needed: with only the typing facts added, induction yields a
    CTI, and the CTI is a genuine one-step break when replayed from its start state."""
    res = induction_step(enc, {"well_formed": INVARIANTS["well_formed"],
                               "hit_soundness": INVARIANTS["hit_soundness"],
                               "ranges": AUX["ranges"]}, 1)
    ctis = [r.cti for r in res if not r.inductive]
    assert ctis
    r = tr.replay(ctis[0], {**INVARIANTS, **AUX})
    assert r.reproduced, r


def test_bmc_unmutated_finds_nothing(enc):
    res = run_bmc(enc, INVARIANTS, 3, aux=AUX)
    assert res.reached == 3 and not res.aux_broken
    assert not [r.name for r in res.invariants if r.violated]


def test_bmc_kills_a_seeded_bug_and_trace_replays():
    m = find("common.can_unpin_keep#0")
    with applied(m):
        e = Encoding(FAST)
        res = run_bmc(e, INVARIANTS, 6, mutant=m.as_json(), stop_at_first=True)
        broken = [r for r in res.invariants if r.violated]
        assert broken
        t = broken[0].trace
        assert tr.replay(t).reproduced
    r = tr.replay(t)      # without the mutant the same actions do not break it
    assert not r.reproduced


def _release_keeps_the_index_entry(o, c):
    """Seeded bug (issue 14's leak): giving a copy back to FREE without taking it out of the
    index -- the block is neither held nor reclaimable by a lookup."""
    return o._replace(pins=0, draft=0, **{f: 0 for f in o.CONTENT})


def test_bmc_kills_a_release_that_skips_the_unpublish():
    """The accounting invariant finds a release that skips a step: spec.common.discard (the
    effect of reject, load_start and load_bad) swapped for one that leaves ``pub`` set."""
    from spec import common
    real = common.discard.__code__
    common.discard.__code__ = _release_keeps_the_index_entry.__code__
    try:
        res = run_bmc(Encoding(FAST), INVARIANTS, 4, stop_at_first=True)
        broken = [r for r in res.invariants if r.violated]
        assert [r.name for r in broken] == ["accounting"], [r.name for r in broken]
        t = broken[0].trace
        assert "reject" in [st["action"] for st in t["steps"]] or \
            "load_start" in [st["action"] for st in t["steps"]], t["steps"]
        assert tr.replay(t).reproduced
    finally:
        common.discard.__code__ = real
    assert not tr.replay(t).reproduced          # the real release keeps accounting


def test_mutant_swaps_code_in_place_and_restores():
    m = find("system.can_lookup#2")
    fn = spec.GUARDS[m.guard]
    before = fn.__code__
    with pytest.raises(RuntimeError):
        with applied(m):
            assert fn.__code__ is not before
            raise RuntimeError("boom")
    assert fn.__code__ is before


def test_every_mutant_compiles_and_differs():
    for m in mutants():
        fn = spec.GUARDS[m.guard]
        orig = fn.__code__
        with applied(m):
            new = fn.__code__
            assert (new.co_code, new.co_consts) != (orig.co_code, orig.co_consts), m.name
        assert fn.__code__ is orig


def test_stale_mutant_is_refused():
    m = find("system.can_lookup#2")
    with pytest.raises(MutantError):
        with applied(Mutant(m.guard, m.index, "something else")):
            pass


def test_minimize_keeps_the_violation():
    m = find("common.can_unpin_keep#0")
    with applied(m):
        acts = search.actions_of(tr.load(_golden("common.can_unpin_keep_0")))
        padded = [("bump_version", ())] + acts
        t = search.trace_from_actions(FAST, padded, "well_formed", m.as_json())
        assert tr.replay(t).reproduced
        small = search.minimize(t)
        assert tr.replay(small).reproduced and len(small["steps"]) <= len(acts)


def _golden(name):
    import pathlib
    return pathlib.Path(__file__).parents[1] / "golden" / f"{name}.json"


@pytest.mark.slow     # ~2.5 min: the witness search for every action dominates, at any size
def test_cli_json_fast():
    out = subprocess.run([sys.executable, "-m", "hybridkv.cli", "prove", "--no-mutation",
                          "--depth", "2", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    j = json.loads(out.stdout)
    assert set(j) == {"invariants", "mutations", "unreachable_actions", "config"}
    assert {r["name"] for r in j["invariants"]} >= set(INVARIANTS)
    for r in j["invariants"]:
        assert set(r) == {"name", "method", "depth", "inductive", "result", "seconds"}
        assert r["result"] == "proven" and r["inductive"] is True and r["depth"] == 2
    assert j["unreachable_actions"] == []
    assert set(j["mutations"]) == {"killed", "total", "survivors"}


CHUNKED = FAST._replace(window=4, chunk=4)   # chunked-local windows: a query reads its chunk


def _covers_one_past_the_chunk_start(o, H, c):
    """Seeded bug: a resume accepts a chunked window that slid one row past its chunk start
    (the query at H reads that row)."""
    from spec.dual import And
    from spec.swa import first_read
    return And(o.hi >= H, o.lo <= first_read(H, c) + 1)


def test_chunked_windows_are_proven_and_a_seeded_bug_is_found():
    """The invariants hold over chunked-local windows (BMC, and the strengthening is
    inductive); under a resume rule off by one row of the chunk the strengthening breaks at a
    lookup: a one-step CTI reproduced with the bug and not without it."""
    from spec import swa
    e = Encoding(CHUNKED)
    res = run_bmc(e, INVARIANTS, 3, aux=AUX)
    assert res.reached == 3 and not [r.name for r in res.invariants if r.violated]
    props = {**INVARIANTS, **AUX}
    bad = [r.name for r in induction_step(e, props, 1) if not r.inductive]
    assert not bad, bad
    real = swa.covers.__code__
    swa.covers.__code__ = _covers_one_past_the_chunk_start.__code__
    try:
        ctis = [r.cti for r in induction_step(Encoding(CHUNKED), props, 1) if not r.inductive]
        assert ctis
        assert [st["action"] for st in ctis[0]["steps"]] == ["lookup"]
        assert tr.replay(ctis[0], props).reproduced
    finally:
        swa.covers.__code__ = real
    assert not tr.replay(ctis[0], props).reproduced
