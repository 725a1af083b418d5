"""Chunked-local attention (``LayerGroup(chunk=C)``, vLLM's ChunkedLocalAttentionSpec): a query
reads its own chunk only, so a resume at H needs the window rows [H - H % C, H) (spec.swa
first_read), a snapshot holds just those, and a request's window pages of earlier chunks are
given back once no query reads them (``oldest_read``: the settled position's chunk start)."""
import pytest
import z3

from hybridkv.cache import CacheManager
from hybridkv.errors import LayoutError
from hybridkv.layout import LayerGroup, ModelLayout
from spec import dual
from spec.config import SysConfig
from spec.dual import concrete
from spec.swa import SwaRec, covers, first_read
from tests.cache.helpers import commit_all

C = 32
LAY = ModelLayout([LayerGroup("f", "full", (0,), 16, 0),
                   LayerGroup("c", "swa", (1,), 16, C, chunk=C)], name="chunked")
P = [(5 * i + 2) % 250 for i in range(200)]


@pytest.fixture
def int_numerals():
    """Numerals the dual helpers mint are Ints (``set_width(None)``) for this test, whatever
    width a prover encoding built earlier in this process left selected."""
    before = dual._WIDTH[0]
    dual.set_width(None)
    yield
    dual.set_width(before)


def test_first_read_is_the_chunk_start_on_ints_and_symbols(int_numerals):
    chunked, windowed = SysConfig(window=4, chunk=4), SysConfig(window=4)
    assert [first_read(H, chunked) for H in (0, 3, 4, 5, 9)] == [0, 0, 4, 4, 8]
    assert [first_read(H, windowed) for H in (0, 3, 4, 5, 9)] == [0, 0, 0, 1, 5]
    H = z3.Int("H")
    s = z3.Solver()
    s.add(H == 9)
    assert s.check() == z3.sat
    assert concrete(s.model().eval(first_read(H, chunked))) == 8
    slid = SwaRec(hi=10, lo=9)              # a window that slid past its chunk start (8)
    assert not covers(slid, 10, chunked) and covers(SwaRec(hi=10, lo=8), 10, chunked)


@pytest.mark.parametrize("bad", [dict(kind="full", window=0), dict(window=48)])
def test_a_chunk_is_an_swa_group_whose_window_is_the_chunk(bad):
    fields = dict(name="c", kind="swa", layers=(0,), block_size=16, window=C, chunk=C)
    fields.update(bad)
    with pytest.raises(LayoutError):
        ModelLayout([LayerGroup(**fields)])


def _run(m, rid, tokens):
    m.lookup(rid, tokens)
    commit_all(m, rid, m.allocate(rid, len(tokens) - m.requests[rid].plan.reuse_tokens))


def test_pages_of_earlier_chunks_are_given_back_as_queries_pass_them():
    m = CacheManager(LAY, num_blocks=64, checked=True)
    m.lookup("a", P[:100])
    a = m.allocate("a", 100)
    m.commit("a", 70, settled_tokens=64)        # queries up to 63 ran: chunk 2 is current
    assert m.tables("a")["c"].swa[:2] == [-1, -1]
    assert m.tables("a")["c"].swa[2] >= 0
    m.commit("a", 30, settled_tokens=100)       # chunk 3 (96..127) is current
    assert m.tables("a")["c"].swa[:3] == [-1, -1, -1]
    m.check_invariants()
    assert a.end == 100


@pytest.mark.parametrize("H", [80, 96])     # inside a chunk, and on a chunk start (empty)
def test_a_resume_needs_only_its_chunk(H):
    m = CacheManager(LAY, num_blocks=64, checked=True, every_n=16)
    _run(m, "a", P[:120])
    m.free("a")
    plan = m.lookup("b", P[:H] + [249] * 8)
    assert plan.reuse_tokens == H
    window = next(r for r in plan.reads if r.ref.kind == "swa")
    rec = m.pools[("swa", "c")].recs[window.ref.block]
    assert (rec.lo, rec.hi) == (H - H % C, H)   # a snapshot holds its chunk so far
    b = m.allocate("b", 8)
    commit_all(m, "b", b)
    m.free("b")
    m.check_invariants()
