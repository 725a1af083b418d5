import atexit
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# Set to 1 to see what the interpreter prints while it tears down (see quiet_teardown).
TEARDOWN_STDERR_ENV = "HYBRIDKV_TEARDOWN_STDERR"


def quiet_teardown() -> None:
    """Triton's native module (nanobind bindings) lists every object of its types still alive
    when the interpreter tears down, "nanobind: leaked ...", ~40 lines after pytest's summary
    (objects teardown does not free; nothing the tests can act on, and Triton exposes no switch
    for nanobind's leak warnings). Registered as the conftest loads, before torch, Triton and
    hypothesis register theirs, this exit handler runs after them (atexit is last in, first
    out): it points fd 2 at /dev/null for the rest of teardown when Triton's native module is
    loaded. The summary and the exit status are untouched."""
    if os.environ.get(TEARDOWN_STDERR_ENV) == "1" or "triton._C.libtriton" not in sys.modules:
        return
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


atexit.register(quiet_teardown)

import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

# Two cores shared with other work: one intra-op thread keeps the torch paths fast and stable.
torch.set_num_threads(1)

settings.register_profile("default", deadline=None, max_examples=50)
settings.register_profile("deep", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
