"""The parametric encoding means what the concrete facts mean.

On small concrete states (seeded random: walks of the real spec, some with a few leaves
changed, and per fact a state of random leaves that breaks it, so every fact is seen false
as well as true) each fact of S is evaluated
twice: by the spec's own function on plain ints, and as the parametric tier's closed
``ForAll`` formula in the finite model holding the same values (``proofs.finite``: every
quantifier instantiated over the state's elements, every count the true count).  The two
truth values must agree, and the count axioms the tier assumes must hold of every state.
Two deliberately wrong translations (``ForAll`` closed as ``Exists``; a count off by one) are
caught by the same comparison."""
import random

import pytest
import z3

from spec.state import initial
from spec.step import actions, step

from proofs.finite import FiniteModel
from proofs.flat import flatten, leaf_paths, unflatten
from proofs.parametric import props
from proofs.run import FAST

# a module fixture is built once per xdist worker: the whole module runs on one (loadgroup)
pytestmark = pytest.mark.xdist_group("test_proofs_parametric_meaning")

SEED = 22
REF_LEAVES = (".ref[", ".obj")      # object indices: kept inside the state's objects


def _walk(c, rng, tries):
    """A reachable state: random actions of the real spec, the enabled ones taken."""
    acts, s = actions(c), initial(c)
    for _ in range(tries):
        name, args = rng.choice(acts)
        en, s2 = step(s, c, name, args)
        s = s2 if en else s
    return s


def _perturb(c, s, rng, n=None):
    """``s`` with ``n`` random leaves (all when None) set to random small values (object
    indices kept inside the state's objects)."""
    paths, leaves = leaf_paths(s), flatten(s)
    for j in (range(len(leaves)) if n is None else
              [rng.randrange(len(leaves)) for _ in range(n)]):
        hi = c.n_obj - 1 if any(x in paths[j] for x in REF_LEAVES) else 5
        leaves[j] = rng.randint(0, hi)
    return unflatten(s, iter(leaves))


SIZES = ((1, 1, 1, 1), (2, 2, 1, 1), (2, 3, 2, 2))   # objects/kind, requests, disks, graphs


def _config(rng):
    n_obj, n_req, n_disk, n_graph = rng.choice(SIZES)
    return FAST._replace(n_obj=n_obj, n_req=n_req, n_disk=n_disk, n_graph=n_graph)


def _sample(rng):
    """(config, state) pairs: six reachable states, six with a few leaves changed, and per
    fact one state of random leaves that breaks it."""
    out = []
    for n in range(12):
        c = _config(rng)
        s = _walk(c, rng, rng.randrange(20, 300))
        out.append((c, _perturb(c, s, rng, rng.randint(1, 3)) if n % 2 else s))
    for name, p in props().items():
        for _ in range(1000):
            c = _config(rng)
            s = _perturb(c, initial(c), rng)
            if not p(s, c):
                out.append((c, s))
                break
        else:
            pytest.fail(f"no random state breaks {name}")
    return out


@pytest.fixture(scope="module")
def sample():
    return _sample(random.Random(SEED))


def _disagreements(penc, sample, closed, stop_at_first=False, axioms=()):
    """(fact, state number, concrete value, parametric value) where they differ; (axiom
    number, state number) where a count axiom is false of a state."""
    out, memo = [], {}
    for n, (c, s) in enumerate(sample):
        fm = FiniteModel(penc.scope, c, s, memo=memo)
        for name, p in props().items():
            want, got = p(s, c), fm.value(closed[name])
            if want != got:
                out.append((name, n, want, got))
                if stop_at_first:
                    return out
        out += [(j, n) for j, ax in enumerate(axioms) if not fm.value(ax)]
    return out


def test_parametric_facts_agree_with_the_spec_on_concrete_states(penc, sample):
    values = {name: {p(s, c) for c, s in sample} for name, p in props().items()}
    assert all(v == {True, False} for v in values.values()), values   # both values seen
    # and what the tier assumes of counts is true of every state
    assert not _disagreements(penc, sample, penc.facts["P"], axioms=penc.axioms["P"])


def _as_exists(f):
    """Every quantifier of ``f`` closed as Exists (a translation bug)."""
    if z3.is_quantifier(f):
        xs = [z3.Const(f"{f.var_name(j)}!e", f.var_sort(j)) for j in range(f.num_vars())]
        return z3.Exists(xs, _as_exists(z3.substitute_vars(f.body(), *reversed(xs))))
    if z3.is_app(f) and f.num_args():
        return f.decl()(*[_as_exists(x) for x in f.children()])
    return f


def test_a_fact_closed_with_exists_is_caught(penc, sample):
    wrong = {n: _as_exists(f) for n, f in penc.facts["P"].items()}
    assert _disagreements(penc, sample, wrong, stop_at_first=True)


def test_a_count_off_by_one_is_caught(penc, sample):
    plus_one = []
    for card in penc.scope.cards.values():
        f = card.func("P")
        xs = [z3.Var(j, o.sort()) for j, o in enumerate(card.outer)]
        plus_one.append((f, f(*xs) + 1))
    wrong = {n: z3.substitute_funs(f, *plus_one) for n, f in penc.facts["P"].items()}
    assert _disagreements(penc, sample, wrong, stop_at_first=True)
