"""Dual-mode equivalence: every guard, invariant and step action gives the same answer on
concrete ints and through Z3 (symbolic form, substitute the values, simplify)."""
import inspect
import random

import pytest
from hypothesis import given, settings, strategies as st

import spec
from spec import dual
from spec.config import Ctx, SysConfig
from spec.state import RECS, initial
from spec.step import actions, step
from tests.spec.spec_symbolic import WIDTH, evaluate, symbolize

C = SysConfig(n_obj=2, n_disk=1, n_req=2, n_graph=1, max_pos=3, ratio=2, overlap=2, window=2,
              granule=1, max_ver=2, max_ep=1, max_iv=1, cap=2)
ACTS = actions(C)


@pytest.fixture(autouse=True)
def _bv_numerals():
    dual.set_width(WIDTH)
    yield
    dual.set_width(None)


INDEX_FIELDS = {"ref", "obj", "tk", "kind"}


def _perturb(value, rng):
    """Randomly rewrite some value leaves within [0, max_pos] (index fields stay in range):
    states off the reachable set exercise guard branches a walk rarely reaches."""
    if hasattr(value, "_fields"):
        return type(value)(*[x if f in INDEX_FIELDS else _perturb(x, rng)
                             for f, x in zip(value._fields, value)])
    if isinstance(value, tuple):
        return tuple(_perturb(x, rng) for x in value)
    return rng.randint(0, C.max_pos) if rng.random() < 0.15 else value


def _state(seed, walk, perturb):
    rng = random.Random(seed)
    s = initial(C)
    for _ in range(walk):
        enabled = [(n, a) for n, a in ACTS if step(s, C, n, a)[0]]
        s = step(s, C, *rng.choice(enabled))[1]
    return _perturb(s, rng) if perturb else s


states = st.builds(_state, st.integers(0, 2**32), st.integers(0, 25), st.booleans())


def _agree(fn, *args):
    pairs = []
    sym_args = [symbolize(a, f"a{i}", pairs) for i, a in enumerate(args)]
    concrete = fn(*args)
    symbolic = fn(*sym_args)
    assert evaluate(symbolic, pairs) == concrete


@settings(max_examples=40)
@given(states, st.randoms(use_true_random=False))
def test_step_agrees(s, rng):
    for name, args in rng.sample(ACTS, 6):
        pairs = []
        sym = symbolize(s, "s", pairs)
        en, nxt = step(s, C, name, args)
        sen, snxt = step(sym, C, name, args)
        assert evaluate(sen, pairs) == en, (name, args)
        assert evaluate(snxt, pairs) == nxt, (name, args)


@given(states)
def test_invariants_agree(s):
    for name, inv in spec.INVARIANTS.items():
        _agree(lambda x: inv(x, C), s)


def _guard_args(fn, s, rng):
    """Arguments for a registered guard, chosen by parameter name."""
    out = []
    for p in inspect.signature(fn).parameters:
        if p == "o":
            objs = [o for objs in s.mem for o in objs] + list(s.disk)
            out.append(rng.choice(objs))
        elif p == "s":
            out.append(s)
        elif p == "ref":
            out.append(tuple(rng.randrange(C.n_obj) for _ in RECS))
        elif p in ("partial_ok", "ready_flags"):
            out.append(tuple(rng.random() < 0.7 for _ in range(4)))
        elif p in ("stored", "expected", "captured_eps", "current_eps", "block_sizes"):
            out.append(tuple(rng.randint(0, 3) for _ in range(4)))
        else:
            sizes = {"r": C.n_req, "g": C.n_graph, "d": C.n_disk}
            out.append(rng.randrange(sizes[p]) if p in sizes else rng.randint(0, 3))
    return out


@settings(max_examples=25)
@given(states, st.randoms(use_true_random=False))
def test_every_guard_agrees(s, rng):
    for name, fn in spec.GUARDS.items():
        args = _guard_args(fn, s, rng)
        params = list(inspect.signature(fn).parameters)
        if "c" in params:
            args[params.index("c")] = Ctx(C, s.miv) if "o" in params else C
        if params[:1] == ["o"]:
            try:
                fn(*args)
            except AttributeError:   # a record of another kind
                continue
        for i, p in enumerate(params):   # divisors are positive
            if p in ("granule", "align"):
                args[i] = max(1, args[i])
            if p == "block_sizes":
                args[i] = tuple(max(1, b) for b in args[i])
        sym_pairs = []
        sym = [a if isinstance(a, (Ctx, SysConfig)) else symbolize(a, f"g{i}", sym_pairs)
               for i, a in enumerate(args)]
        if isinstance(args[params.index("c")] if "c" in params else None, Ctx):
            ctx = args[params.index("c")]
            sym[params.index("c")] = Ctx(C, symbolize(ctx.miv, "miv", sym_pairs))
        assert evaluate(fn(*sym), sym_pairs) == fn(*args), name
