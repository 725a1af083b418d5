"""Trace reader, token expansion and the synthetic generator."""
import gzip
import json

import pytest

from hybridkv.bench.traces import (NS_MIN_SPAN, NS_MIN_TIMESTAMP, HashIdCountMismatch,
                                   TraceFormatError, block_token_ids, read_mooncake,
                                   reconciled_length, request_token_ids, synthetic_trace,
                                   timestamp_unit)

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
        read_mooncake(path, strict=True)
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
    with pytest.raises(HashIdCountMismatch):          # 4 ids cannot cover n_a in other units
        read_mooncake(_write(tmp_path / "n.jsonl", rows), block_size=2 * block, strict=True)


# -- traces in the wild: timestamps -------------------------------------------------------------
def _stamped(stamps):
    return [{**ROWS[0], "timestamp": s} for s in stamps]


def test_timestamps_as_ints_floats_and_numeric_strings_in_ms(tmp_path):
    tr = read_mooncake(_write(tmp_path / "ms.jsonl", _stamped([0, 1.5, "3", " 4.25 ", "5e1"])))
    assert tr.timestamp_unit == "ms"
    assert [r.timestamp_ms for r in tr.requests] == [0, 1.5, 3, 4.25, 50.0]


def test_nanosecond_strings_are_read_as_ns(tmp_path):
    """Epoch nanoseconds as strings (too large for a float to keep exactly), and relative
    nanoseconds spanning 20 s: both become milliseconds."""
    epoch = _stamped(["1718000000000000000", "1718000000500000000"])
    tr = read_mooncake(_write(tmp_path / "epoch.jsonl", epoch))
    assert tr.timestamp_unit == "ns"
    first, second = (r.timestamp_ms for r in tr.requests)
    assert first == pytest.approx(1.718e12) and second - first == pytest.approx(500.0)
    rel = read_mooncake(_write(tmp_path / "rel.jsonl", _stamped([0, 20 * 10**9])))
    assert rel.timestamp_unit == "ns" and [r.timestamp_ms for r in rel.requests] == [0, 20_000]


def test_timestamp_unit_rule_by_magnitude():
    epoch_ms = 1_718_000_000_000
    assert timestamp_unit(0, 3_536_999) == "ms"                   # Mooncake: 59 min in ms
    assert timestamp_unit(epoch_ms, epoch_ms + 3_600_000) == "ms"  # epoch ms
    assert timestamp_unit(0, NS_MIN_SPAN - 1) == "ms"
    assert timestamp_unit(0, NS_MIN_SPAN) == "ns"                  # 10 s in ns
    assert timestamp_unit(NS_MIN_TIMESTAMP, NS_MIN_TIMESTAMP) == "ns"
    assert timestamp_unit(1.718e18, 1.718e18) == "ns"             # epoch ns, one request


def test_explicit_timestamp_unit_overrides_the_rule(tmp_path):
    path = _write(tmp_path / "short_ns.jsonl", _stamped([0, 2_000_000]))
    assert [r.timestamp_ms for r in read_mooncake(path).requests] == [0, 2_000_000]
    assert [r.timestamp_ms for r in read_mooncake(path, unit="ns").requests] == [0, 2.0]
    with pytest.raises(TraceFormatError) as ei:
        read_mooncake(path, unit="seconds")
    assert ei.value.value == "seconds"


@pytest.mark.parametrize("stamp", ["12ms", "", "-3", "1_000", "nan", "inf", "1e400",
                                   float("nan"), True, None, [1], "\u0661", 2**63,
                                   str(10**400)])
def test_bad_timestamp_named_error_with_value(tmp_path, stamp):
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], {**ROWS[1], "timestamp": stamp}])
    with pytest.raises(TraceFormatError) as ei:
        read_mooncake(path)
    assert ei.value.line_no == 2
    assert ei.value.value == stamp or stamp != stamp            # NaN != NaN


# -- traces in the wild: hash ids that disagree with the input length ---------------------------
def test_reconciled_length_moves_the_length_into_the_ids_range():
    assert reconciled_length(1000, 2, 512) == 1000                # agrees: unchanged
    assert reconciled_length(1000, 1, 512) == 512                 # too long for 1 id
    assert reconciled_length(1000, 4, 512) == 3 * 512 + 1        # 4 ids need > 1536 tokens


def test_hash_ids_decide_the_blocks_when_the_count_disagrees(tmp_path):
    rows = [ROWS[0],                                                      # agrees
            {**ROWS[1], "input_length": 600},                             # 3 ids, 600 tokens
            {**ROWS[2], "input_length": 2000}]                            # 1 id, 2000 tokens
    tr = read_mooncake(_write(tmp_path / "approx.jsonl", rows))
    assert [r.input_length for r in tr.requests] == [1000, 1025, 512]
    assert [r.hash_ids for r in tr.requests] == [(0, 1), (0, 1, 2), (0,)]
    assert tr.reconciled == ((1, 600), (2, 2000))
    assert tr.reconciled_tokens() == (425, 1488)
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in tr.requests)
    assert len(request_token_ids(tr, tr.requests[1])) == 1025
    assert tr.head(2).reconciled == ((1, 600),) and tr.head(1).reconciled == ()
    with pytest.raises(HashIdCountMismatch) as ei:
        read_mooncake(_write(tmp_path / "approx.jsonl", rows), strict=True)
    assert (ei.value.line_no, ei.value.value, ei.value.input_length) == (2, [0, 1, 2], 600)
