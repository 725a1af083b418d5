"""``step`` and the enumeration of concrete actions."""
import itertools

from spec import requests, transfers  # noqa: F401  (register their actions)
from spec.system import ACTIONS


def step(s, c, name, args):
    """(enabled, next state) of one action.  The next state is computed even when the
    action is disabled; callers keep it only when ``enabled`` holds."""
    fn, _ = ACTIONS[name]
    return fn(s, c, *args)


def actions(c):
    """Every concrete (name, args) pair of configuration c."""
    out = []
    for name, (_, domains) in ACTIONS.items():
        out.extend((name, args) for args in itertools.product(*domains(c)))
    return out
