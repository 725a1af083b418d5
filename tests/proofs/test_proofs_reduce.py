"""The deep tier's BMC backend (proofs.satbmc): the bit-blasted CNF template is the spec's
step, the SAT unrolling reaches exactly the states the spec reaches, the per-action case
split changes no verdict, and seeded mutants are still found.  Slow: the DEEP sizes."""
import json
import pathlib
import random

import pytest

from spec import INVARIANTS, initial, step
from spec.step import actions

from proofs import trace as tr
from proofs.aux import AUX
from proofs.bmc import run_bmc
from proofs.encode import Encoding, flatten
from proofs.mutate import applied, find
from proofs.run import DEEP, FAST
from proofs.satbmc import SatUnrolling, deep_bmc, sat_bmc, template

# a module fixture is built once per xdist worker: the whole module runs on one (loadgroup)
pytestmark = pytest.mark.xdist_group("test_proofs_reduce")

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"
# short golden traces; each names its own mutant and configuration
SEEDED = ("system.can_admit_0", "common.can_unpin_keep_0")


@pytest.fixture(scope="module")
def enc():
    return Encoding(FAST)


@pytest.fixture(scope="module")
def tpl(enc):
    return template(enc, {**INVARIANTS, **AUX})


def _lits(bits, x):
    return [v if (x >> i) & 1 else -v for i, v in enumerate(bits) if v]


def _value(model, bits):
    return sum(1 << i for i, v in enumerate(bits) if v and v in model)


def _bind(u, ins, args):
    """Assumption literals: the last step takes instance ``ins`` with concrete ``args``."""
    sel, argbits = u.steps[-1]
    out = _lits(sel, u.enc.inst.index(ins))
    for a, v in zip(ins.args, args):
        if isinstance(a, str):
            for bits, x in zip(argbits[a], v if isinstance(v, tuple) else (v,)):
                out += _lits(bits, x)
        elif a != v:
            return None
    return out


def _walk(c, n, seed):
    rng = random.Random(seed)
    s, out, acts = initial(c), [], actions(c)
    for _ in range(n):
        out.append(s)
        s = step(s, c, *rng.choice([a for a in acts if step(s, c, *a)[0]]))[1]
    return out


def test_template_step_agrees_with_spec_step(enc, tpl):
    """From concrete states along a random run, every sampled (action, args): the CNF is
    satisfiable with that choice iff spec.step enables it, and then its next state and the
    predicate outputs are exactly spec.step's."""
    c, rng, checked = FAST, random.Random(3), 0
    for s in _walk(c, 20, seed=4)[::5]:
        u = SatUnrolling(enc, tpl, init=False)
        fixed = [lit for bits, x in zip(u.states[0], flatten(s)) for lit in _lits(bits, x)]
        u.extend()
        for name, args in rng.sample(actions(c), 30):
            binds = [b for b in (_bind(u, ins, args) for ins in enc.inst if ins.name == name)
                     if b is not None]
            assert len(binds) == 1, (name, args)
            en, s2 = step(s, c, name, args)
            assert u.sol.solve(assumptions=fixed + binds[0]) == bool(en), (name, args)
            if en:
                model = set(x for x in u.sol.get_model() if x > 0)
                assert [_value(model, bs) for bs in u.states[1]] == flatten(s2), (name, args)
                for n, p in {**INVARIANTS, **AUX}.items():
                    assert (u.outs[1][n] in model) == bool(p(s2, c)), n
            checked += 1
    assert checked >= 60


def _bfs(c, d):
    """Concrete states reachable in exactly d steps (plain ints, spec.step)."""
    layer, acts = {tuple(flatten(initial(c)))}, actions(c)
    template_state = initial(c)
    from proofs.encode import unflatten
    for _ in range(d):
        nxt = set()
        for leaves in layer:
            s = unflatten(template_state, iter(leaves))
            for a in acts:
                en, s2 = step(s, c, *a)
                if en:
                    nxt.add(tuple(flatten(s2)))
        layer = nxt
    return layer


def test_sat_unrolling_reaches_exactly_the_spec_states(enc, tpl):
    """All models of the depth-2 unrolling, projected on the last state, are exactly the
    states an explicit search reaches in 2 steps (no state lost, none invented)."""
    u = SatUnrolling(enc, tpl)
    u.extend()
    u.extend()
    got = set()
    while u.sol.solve():
        model = set(x for x in u.sol.get_model() if x > 0)
        leaves = tuple(_value(model, bs) for bs in u.states[-1])
        got.add(leaves)
        u.sol.add_clause([-lit for bs, x in zip(u.states[-1], leaves)
                          for lit in _lits(bs, x)])
        assert len(got) < 5000
    assert got == _bfs(FAST, 2)


def test_unmutated_verdicts_match_z3_bmc(enc):
    a = sat_bmc(enc, INVARIANTS, 3, aux=AUX)
    b = run_bmc(enc, INVARIANTS, 3, aux=AUX)
    assert a.reached == b.reached == 3 and not a.unknown
    assert [r.violated for r in a.invariants] == [r.violated for r in b.invariants]
    assert not any(r.violated for r in a.invariants) and a.aux_broken == b.aux_broken == []


def _seeded(stem):
    g = tr.load(GOLDEN / f"{stem}.json")
    m = find(f"{g['mutant']['guard']}#{g['mutant']['index']}")
    return g, m, tr.config_of(g)


@pytest.mark.parametrize("stem", SEEDED)
def test_seeded_mutant_found_at_golden_depth(stem):
    """BMC to the golden trace's length finds a violation under the mutant, no deeper than
    the golden trace, at the same depth with and without the per-action case split; the
    trace replays under the mutant only."""
    g, m, c = _seeded(stem)
    n = len(g["steps"])
    found = {}
    with applied(m):
        enc = Encoding(c)
        for split in (True, False):
            res = sat_bmc(enc, INVARIANTS, n, aux=AUX, mutant=m.as_json(),
                          stop_at_first=True, split=split)
            bad = [r for r in res.invariants if r.violated]
            assert bad, (stem, split)
            found[split] = (res.depth, sorted(r.name for r in bad))
            t = bad[0].trace
            assert len(t["steps"]) == res.depth <= n and tr.replay(t).reproduced
    assert found[True] == found[False]
    assert not tr.replay(t).reproduced


def test_deep_bmc_contract_and_budget():
    """A tiny budget ends the run as unknown at a complete depth, not with a verdict."""
    res = deep_bmc(FAST, depth=30, budget_s=3.0)
    assert res.unknown and 0 <= res.reached < 30
    assert not any(r.violated for r in res.invariants)


@pytest.mark.slow
@pytest.mark.parametrize("stem", SEEDED)
def test_seeded_mutant_found_on_deep_sizes(stem):
    g, m, _ = _seeded(stem)
    with applied(m):
        res = deep_bmc(DEEP, depth=len(g["steps"]), mutant=m.as_json(), stop_at_first=True)
    bad = [r for r in res.invariants if r.violated]
    assert bad and len(bad[0].trace["steps"]) <= len(g["steps"])
    with applied(m):
        assert tr.replay(bad[0].trace).reproduced
    assert not tr.replay(bad[0].trace).reproduced


@pytest.mark.slow
def test_deep_bmc_depth_30():
    res = deep_bmc(DEEP, depth=30)
    assert res.reached == 30 and not res.unknown and not res.aux_broken
    assert not any(r.violated for r in res.invariants), json.dumps(
        [r.trace for r in res.invariants if r.violated])[:2000]
