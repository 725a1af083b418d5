"""The traces shipped inside the package, by name.

`hybridkv/bench/data/` holds the two Mooncake FAST'25 traces (Apache-2.0; each folder has the
licence and a README with the source), installed as package data, so `hybridkv replay
mooncake-conversation` and `hybridkv bench vs-vllm` need no file beside the checkout.

`trace_path(spec)` is the one place a trace argument becomes a file: a name of `NAMED_TRACES`
is the shipped file, anything else is a path and is returned unchanged (a file that happens to
carry a trace's name is reached as `./NAME`).
"""
from __future__ import annotations

import os
from importlib import resources

# name -> file under hybridkv/bench/data/
NAMED_TRACES = {
    "mooncake-conversation": "mooncake_conversation/conversation_trace.jsonl.gz",
    "mooncake-synthetic": "mooncake_synthetic/synthetic_trace.jsonl.gz",
}
DEFAULT_TRACE = "mooncake-conversation"


class ShippedTraceMissing(FileNotFoundError):
    """A named trace's file is not in the installed package (a build that left out the package
    data). Carries `name` and `path`."""

    def __init__(self, name: str, path: str):
        super().__init__(f"shipped trace {name!r} is missing from the installed package: {path}")
        self.name = name
        self.path = path


def data_dir() -> str:
    """The folder of the shipped traces inside the installed package."""
    return str(resources.files("hybridkv.bench") / "data")


def trace_path(spec: str) -> str:
    """A trace argument -> a file path: a name of NAMED_TRACES -> the shipped file (raises
    ShippedTraceMissing when the install lacks it); any other string is returned unchanged."""
    relative = NAMED_TRACES.get(spec)
    if relative is None:
        return spec
    path = os.path.join(data_dir(), *relative.split("/"))
    if not os.path.isfile(path):
        raise ShippedTraceMissing(spec, path)
    return path
