"""Trace reader, token expansion and the synthetic generator."""
import gzip
import json

import pytest

from hybridkv.bench.traces import (TraceFormatError, block_token_ids, read_mooncake,
                                   request_token_ids, synthetic_trace)

ROWS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 3, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 2]},
    {"timestamp": 3, "input_length": 512, "output_length": 0, "hash_ids": [0]},
]


def _write(path, rows, gz=False):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def test_plain_and_gzip_read_the_same(tmp_path):
    a = read_mooncake(_write(tmp_path / "t.jsonl", ROWS))
    b = read_mooncake(_write(tmp_path / "t.jsonl.gz", ROWS, gz=True))
    c = read_mooncake(_write(tmp_path / "gz_without_suffix", ROWS, gz=True))
    assert a.requests == b.requests == c.requests
    assert [r.hash_ids for r in a.requests] == [(0, 1), (0, 1, 2), (0,)]
    assert a.block_tokens(a.requests[0], 1) == 1000 - 512
    assert len(read_mooncake(str(tmp_path / "t.jsonl"), limit=2)) == 2


@pytest.mark.parametrize("bad", [
    "not json",
    json.dumps([1, 2]),
    json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 1}),
    json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0]}),
    json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}),
    json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [True]}),
    json.dumps({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]}),
    json.dumps({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}),
    json.dumps({"timestamp": 0, "input_length": 10, "output_length": "x", "hash_ids": [0]}),
])
def test_bad_line_raises_named_error_with_line(tmp_path, bad):
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], bad])
    with pytest.raises(TraceFormatError) as ei:
        read_mooncake(path)
    assert ei.value.line_no == 2


def test_decreasing_timestamps_and_truncated_gzip(tmp_path):
    rows = [dict(ROWS[1]), dict(ROWS[0])]
    with pytest.raises(TraceFormatError) as ei:
        read_mooncake(_write(tmp_path / "order.jsonl", rows))
    assert ei.value.value == 0
    good = _write(tmp_path / "g.jsonl.gz", ROWS * 50, gz=True)
    data = open(good, "rb").read()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError):
        read_mooncake(str(cut))


def test_token_expansion_deterministic_and_distinct():
    a = block_token_ids(42, "", 512, 1000)
    assert a == block_token_ids(42, "", 512, 1000)
    assert len(a) == 512 and all(0 <= t < 1000 for t in a)
    assert a != block_token_ids(43, "", 512, 1000)
    assert a != block_token_ids(42, "tenantB", 512, 1000)
    assert block_token_ids(42, "", 100, 1000) == a[:100]
    with pytest.raises(TraceFormatError):
        block_token_ids(1, "", 10, 1)


def test_equal_prefix_ids_give_equal_tokens(tmp_path):
    tr = read_mooncake(_write(tmp_path / "t.jsonl", ROWS))
    t0, t1, t2 = (request_token_ids(tr, r, 5000) for r in tr.requests)
    assert len(t0) == 1000 and len(t1) == 1500 and len(t2) == 512
    assert t1[:512] == t0[:512] == t2
    assert t1[512:1000] == t0[512:1000]       # block 1 is shared (id 1 at position 1)


def test_synthetic_generator_is_deterministic_and_chained():
    a = synthetic_trace(300, seed=3)
    assert a.requests == synthetic_trace(300, seed=3).requests
    assert a.requests != synthetic_trace(300, seed=4).requests
    pred = {}
    shared = 0
    seen = set()
    for r in a.requests:
        assert len(r.hash_ids) == -(-r.input_length // a.block_size)
        for i, k in enumerate(a.keys(r)):
            p = a.keys(r)[i - 1] if i else None
            assert pred.setdefault(k, p) == p      # an id never follows two predecessors
        shared += a.keys(r)[0] in seen
        seen.update(a.keys(r))
    assert shared > 100                           # multi-turn / system prompts do repeat
    assert len({r.tenant for r in a.requests}) > 1
    with pytest.raises(TraceFormatError):
        synthetic_trace(10, tenants=0)


@pytest.mark.parametrize("block", [16, 64, 512])
def test_block_size_n_and_partial_last_blocks(tmp_path, block):
    """Ids of `block`-token blocks; input lengths not a multiple of it (the last id holds the
    rest); the same ids give the same tokens whatever a request's length."""
    n_a, n_b = 3 * block + 5, 4 * block + 1
    rows = [{"timestamp": 0, "input_length": n_a, "output_length": 1, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 1, "input_length": n_b, "output_length": 1,
             "hash_ids": [0, 1, 2, 7, 8]}]
    tr = read_mooncake(_write(tmp_path / "n.jsonl", rows), block_size=block)
    a, b = (request_token_ids(tr, r) for r in tr.requests)
    assert (len(a), len(b)) == (n_a, n_b) and tr.block_size == block
    assert a[:3 * block] == b[:3 * block] and a[3 * block:] != b[3 * block:3 * block + 5]
    assert tr.block_tokens(tr.requests[0], 3) == 5 and tr.block_tokens(tr.requests[1], 4) == 1
    with pytest.raises(TraceFormatError):              # 4 ids cannot cover n_a in other units
        read_mooncake(_write(tmp_path / "n.jsonl", rows), block_size=2 * block)
