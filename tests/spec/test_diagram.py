"""The committed mermaid diagrams are generated from spec/ and must not go stale."""
from hybridkv.commands import diagram


def test_committed_diagrams_match_the_spec():
    assert diagram.DEFAULT_OUT.read_text() == diagram.render(), \
        "docs/machines.md is stale: run `hybridkv diagram`"


def test_diagram_shows_every_guard():
    text = diagram.render()
    for guard in ("can_seal", "can_evict", "can_slide", "can_mark_stale", "can_load_ok"):
        assert f"[{guard}]" in text
