"""The shipped traces: every name resolves to a readable trace with its licence beside it, a path
passes through, and pyproject's package data carries every file of hybridkv/bench/data."""
from pathlib import Path, PurePosixPath

import pytest

from hybridkv.bench import shipped
from hybridkv.bench.shipped import NAMED_TRACES, ShippedTraceMissing, trace_path
from hybridkv.bench.traces import read_mooncake

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "hybridkv" / "bench" / "data"


@pytest.mark.parametrize("name", sorted(NAMED_TRACES))
def test_a_name_is_a_shipped_trace_with_its_licence(name):
    path = Path(trace_path(name))
    assert path.is_file() and path.is_relative_to(DATA)
    assert "Apache License" in (path.parent / "LICENSE-APACHE").read_text()
    assert "github.com/kvcache-ai/Mooncake" in (path.parent / "README.md").read_text()
    trace = read_mooncake(str(path), limit=5, strict=True)
    assert len(trace) == 5 and trace.timestamp_unit == "ms" and trace.reconciled == ()


def test_a_path_passes_through_and_a_missing_file_is_named(tmp_path, monkeypatch):
    assert trace_path(str(tmp_path / "t.jsonl")) == str(tmp_path / "t.jsonl")
    monkeypatch.setattr(shipped, "data_dir", lambda: str(tmp_path))
    with pytest.raises(ShippedTraceMissing) as ei:
        trace_path("mooncake-synthetic")
    assert ei.value.name == "mooncake-synthetic" and ei.value.path.startswith(str(tmp_path))


def test_package_data_covers_every_shipped_file():
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["hybridkv.bench"]
    files = [PurePosixPath(p.relative_to(DATA.parent).as_posix())
             for p in DATA.rglob("*") if p.is_file()]
    assert len(files) >= 1 + 3 * len(NAMED_TRACES)
    assert [f for f in files if not any(f.match(g) for g in globs)] == []
