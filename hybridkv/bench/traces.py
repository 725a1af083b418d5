"""Serving traces for replay: a Mooncake-format JSONL reader and a synthetic generator.

A trace is a list of `Request`s in arrival order. `hash_ids` are prefix-chained block ids: an id
names the whole prefix up to and including its block, so equal ids at the same position of two
requests mean a shareable prefix (Mooncake FAST'25 format, 512-token blocks). `tenant` salts the
ids of a request; ids of different tenants never collide in `Trace.keys()`.

Traces in the wild. A timestamp is an int, a float or a numeric string; a trace's timestamps are
milliseconds or nanoseconds, decided once per trace by magnitude (`timestamp_unit`) unless the
unit is given, and `Request.timestamp_ms` is always milliseconds. When a request's hash-id count
disagrees with ceil(input_length / block_size) (public traces whose ids are approximate), the ids
decide its blocks: its input length is moved into the range they cover (`reconciled_length`) and
the request is listed in `Trace.reconciled`; strict reading refuses (HashIdCountMismatch).

`block_size` is the number of tokens one hash id stands for: 512 in the Mooncake traces, 16-64 in
other public traces (`hybridkv replay --block-tokens N`); a request's last block holds the rest of
its input (input_length need not be a multiple of it).

Token expansion (`block_token_ids`, `request_token_ids`) is deterministic: SHAKE-128 of (tenant,
id) read as a stream of 4-byte words, each reduced mod vocab. Equal (tenant, id) always give equal
tokens, a shorter block is a prefix of a longer one with the same id (the stream is the same), and
the runtime can be fed real token lists (about 0.5 ms for a 14k-token prompt).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import numpy as np

DEFAULT_BLOCK_SIZE = 512
DEFAULT_VOCAB = 32_000
TIMESTAMP_UNITS = ("auto", "ms", "ns")
NS_PER_MS = 1_000_000
NS_MIN_TIMESTAMP = 10**13      # timestamp_unit: a last timestamp this large is in ns
NS_MIN_SPAN = 10**10           # timestamp_unit: a span this large is in ns
MAX_TIMESTAMP = 2**63          # an int timestamp at or above it is refused (int64 ns: year 2262)


class TraceFormatError(ValueError):
    """A trace line or argument is malformed. Carries `line_no` (1-based, 0 if not a line) and
    the offending `value`."""

    def __init__(self, message: str, value: object = None, line_no: int = 0):
        where = f"line {line_no}: " if line_no else ""
        super().__init__(f"{where}{message}: {value!r}"[:500])
        self.value = value
        self.line_no = line_no


class HashIdCountMismatch(TraceFormatError):
    """Strict reading: a request's hash-id count is not ceil(input_length / block_size).
    Carries the ids as `value`, and `input_length`, `block_size`, `line_no`."""

    def __init__(self, ids: list, input_length: int, block_size: int, line_no: int = 0):
        super().__init__(f"len(hash_ids)={len(ids)} != ceil(input_length={input_length} / "
                         f"{block_size})", ids, line_no)
        self.input_length = input_length
        self.block_size = block_size


class Request(NamedTuple):
    timestamp_ms: int | float
    input_length: int
    output_length: int
    hash_ids: tuple
    tenant: str = ""

    @property
    def output_class(self) -> str:
        """Output-length bucket (bit_length // 2, capped at 6), known at admission as an
        engine's max_tokens is: the request class the eviction policies learn reuse by (on both
        Mooncake traces blocks left by requests with >= 128 output tokens are rarely reused)."""
        return f"out{min(self.output_length.bit_length() // 2, 6)}"


@dataclass(frozen=True)
class Trace:
    """A named, ordered list of requests over blocks of `block_size` tokens."""
    name: str
    requests: tuple
    block_size: int = DEFAULT_BLOCK_SIZE
    timestamp_unit: str = "ms"        # the unit the file's timestamps were read in
    # (index, input length as read) of each request whose hash-id count disagreed with its
    # input length; its input_length was moved to the ids (traces.reconciled_length)
    reconciled: tuple = ()

    def __len__(self) -> int:
        return len(self.requests)

    def keys(self, req: Request) -> tuple:
        """Cache keys of a request's blocks: the ids, salted by tenant when there is one."""
        if not req.tenant:
            return req.hash_ids
        return tuple((req.tenant, h) for h in req.hash_ids)

    def block_tokens(self, req: Request, i: int) -> int:
        """Number of prompt tokens in block i of `req` (the last block is usually partial)."""
        return min(self.block_size, req.input_length - i * self.block_size)

    def reusable_blocks(self, req: Request) -> int:
        """The most leading blocks of `req` an engine can reuse: whole blocks only, and never
        the whole prompt (its last token is always computed; vLLM's get_computed_blocks)."""
        return (req.input_length - 1) // self.block_size

    def head(self, n: int | None) -> "Trace":
        if n is None:
            return self
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TraceFormatError("limit must be a non-negative int", n)
        return Trace(self.name, self.requests[:n], self.block_size, self.timestamp_unit,
                     tuple((i, n_read) for i, n_read in self.reconciled if i < n))

    def reconciled_tokens(self) -> tuple:
        """(prompt tokens added, prompt tokens removed) by moving input lengths to the ids."""
        deltas = [self.requests[i].input_length - n_read for i, n_read in self.reconciled]
        return sum(d for d in deltas if d > 0), -sum(d for d in deltas if d < 0)


def _check_int(obj: dict, key: str, line_no: int, minimum: int = 0) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise TraceFormatError(f"field {key!r} must be an int >= {minimum}", v, line_no)
    return v


_NUMERIC = re.compile(r"\s*(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", re.ASCII)


def parse_timestamp(value: object, line_no: int = 0) -> int | float:
    """A trace timestamp as written: an int, a float or a numeric string ("1718000000123456789",
    "12.5", "3e9"), finite and >= 0. Its unit is decided per trace (`timestamp_unit`)."""
    number = value
    if isinstance(value, str):
        if not _NUMERIC.fullmatch(value):
            raise TraceFormatError("timestamp string is not a non-negative number", value,
                                   line_no)
        text = value.strip()
        number = int(text) if text.isdigit() else float(text)
    if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0 \
            or not (number < MAX_TIMESTAMP if isinstance(number, int) else math.isfinite(number)):
        raise TraceFormatError("timestamp must be a number in [0, 2**63) (int, float or numeric "
                               "string)", value, line_no)
    return number


def timestamp_unit(first: float, last: float) -> str:
    """The unit of a trace's timestamps, decided once per trace from its first and last one:
    "ns" when the last is >= NS_MIN_TIMESTAMP (10**13: as ms that is the year 2286, as ns 2.8
    hours) or the span last - first is >= NS_MIN_SPAN (10**10: as ms 115 days, as ns 10 s);
    else "ms". Epoch and relative ms traces read as ms; epoch ns traces and relative ns traces
    spanning 10 s or more read as ns (shorter relative ns traces need `unit="ns"`)."""
    return "ns" if last >= NS_MIN_TIMESTAMP or last - first >= NS_MIN_SPAN else "ms"


def reconciled_length(input_length: int, num_ids: int, block_size: int) -> int:
    """The input length moved into the range that `num_ids` ids of `block_size` tokens cover,
    [(num_ids - 1) * block_size + 1, num_ids * block_size]: the ids decide the blocks, the
    length changes as little as it must (unchanged when the count agrees)."""
    return min(max(input_length, (num_ids - 1) * block_size + 1), num_ids * block_size)


class TraceLine(NamedTuple):
    """One request as read from a line: the timestamp in the file's unit, the request (its
    timestamp_ms is filled in once the trace's unit is known), and the input length the line
    gave (it differs from request.input_length when the ids decided the length)."""
    timestamp: int | float
    request: Request
    input_length_read: int


def parse_request(line: str, line_no: int = 0, block_size: int = DEFAULT_BLOCK_SIZE,
                  strict: bool = False) -> TraceLine:
    """One Mooncake JSONL line -> TraceLine. Raises TraceFormatError on any malformed field.
    When len(hash_ids) != ceil(input_length / block_size) the ids are used and the length is
    moved to them (`reconciled_length`); `strict` refuses instead (HashIdCountMismatch)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceFormatError("not JSON", line.strip()[:80], line_no) from e
    if not isinstance(obj, dict):
        raise TraceFormatError("line is not a JSON object", obj, line_no)
    ts = parse_timestamp(obj.get("timestamp"), line_no)
    n_in = _check_int(obj, "input_length", line_no, minimum=1)
    n_out = _check_int(obj, "output_length", line_no)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not ids or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
        raise TraceFormatError("hash_ids must be a non-empty list of non-negative ints", ids,
                               line_no)
    if strict and len(ids) != math.ceil(n_in / block_size):
        raise HashIdCountMismatch(ids, n_in, block_size, line_no)
    tenant = obj.get("tenant", "")
    if not isinstance(tenant, str):
        raise TraceFormatError("tenant must be a string", tenant, line_no)
    length = reconciled_length(n_in, len(ids), block_size)
    return TraceLine(ts, Request(0, length, n_out, tuple(ids), tenant), n_in)


def _open_text(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "rt", encoding="utf-8")


def iter_lines(path: str, block_size: int = DEFAULT_BLOCK_SIZE, limit: int | None = None,
               strict: bool = False) -> Iterator[TraceLine]:
    """Yield the requests of a Mooncake-format JSONL file as read (`parse_request`), plain or
    gzip (detected by magic bytes, not by the file name). Blank lines are skipped. Timestamps
    must not decrease."""
    last_ts: int | float = -1
    n = 0
    with _open_text(path) as f:
        try:
            for line_no, line in enumerate(f, 1):
                if limit is not None and n >= limit:
                    return
                if not line.strip():
                    continue
                row = parse_request(line, line_no, block_size, strict)
                if row.timestamp < last_ts:
                    raise TraceFormatError("timestamps must not decrease", row.timestamp,
                                           line_no)
                last_ts = row.timestamp
                n += 1
                yield row
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise TraceFormatError("unreadable trace file", path) from e


def read_mooncake(path: str, block_size: int = DEFAULT_BLOCK_SIZE, limit: int | None = None,
                  strict: bool = False, unit: str = "auto") -> Trace:
    """Read a whole Mooncake-format trace (see `iter_lines`). Timestamps become milliseconds:
    `unit` "ms" or "ns", or "auto" for the rule of `timestamp_unit` over the requests read.
    Requests whose hash-id count disagrees with their input length are listed in
    `Trace.reconciled` (`strict`: refused with HashIdCountMismatch)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise TraceFormatError("limit must be a non-negative int", limit)
    if unit not in TIMESTAMP_UNITS:
        raise TraceFormatError(f"timestamp unit must be one of {TIMESTAMP_UNITS}", unit)
    rows = list(iter_lines(path, block_size, limit, strict))
    if unit == "auto":
        unit = timestamp_unit(rows[0].timestamp, rows[-1].timestamp) if rows else "ms"
    per_ms = NS_PER_MS if unit == "ns" else 1
    requests = tuple(r.request._replace(timestamp_ms=r.timestamp / per_ms if per_ms > 1
                                        else r.timestamp) for r in rows)
    reconciled = tuple((i, r.input_length_read) for i, r in enumerate(rows)
                       if r.input_length_read != r.request.input_length)
    name = path.rsplit("/", 1)[-1].split(".")[0]
    return Trace(name, requests, block_size, unit, reconciled)


def _block_array(hash_id: int, tenant: str, n: int, vocab: int) -> np.ndarray:
    words = hashlib.shake_128(f"{tenant}\x00{hash_id}".encode()).digest(4 * n)
    return np.frombuffer(words, dtype="<u4") % vocab


def _check_expansion(n: int, vocab: int) -> None:
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2 or vocab > 1 << 32 \
            or n < 0:
        raise TraceFormatError("need 2 <= vocab <= 2**32 and n >= 0", (vocab, n))


def block_token_ids(hash_id: int, tenant: str = "", n: int = DEFAULT_BLOCK_SIZE,
                    vocab: int = DEFAULT_VOCAB) -> list:
    """Deterministic token ids for one block (see the module docstring): equal (tenant, id) ->
    equal tokens; ``n`` tokens of a block are the first ``n`` of any longer expansion."""
    _check_expansion(n, vocab)
    return _block_array(hash_id, tenant, n, vocab).tolist()


def request_token_ids(trace: Trace, req: Request, vocab: int = DEFAULT_VOCAB) -> list:
    """The full prompt of `req` as token ids: one expansion per hash id of `trace.block_size`
    tokens, the last one truncated to the rest of input_length."""
    _check_expansion(trace.block_size, vocab)
    parts = [_block_array(h, req.tenant, trace.block_tokens(req, i), vocab)
             for i, h in enumerate(req.hash_ids)]
    return np.concatenate(parts).tolist() if parts else []


def synthetic_trace(num_requests: int = 2000, seed: int = 0, tenants: int = 4,
                    block_size: int = DEFAULT_BLOCK_SIZE, rate_per_s: float = 4.0,
                    system_blocks: Sequence[int] = (2, 4, 8), mean_turns: float = 4.0,
                    active: int = 64) -> Trace:
    """Multi-turn, multi-tenant generator. Each tenant has a few system prompts (shared prefixes
    of `system_blocks` blocks); a conversation picks one, and each turn's prompt is the previous
    prompt + previous output + a new user message, so its leading full blocks repeat the previous
    turn's ids. `active` conversations interleave; arrivals are Poisson. Deterministic in `seed`."""
    if num_requests < 0 or tenants < 1 or block_size < 1 or active < 1 or rate_per_s <= 0:
        raise TraceFormatError("bad synthetic_trace arguments",
                               (num_requests, tenants, block_size, active, rate_per_s))
    rng = random.Random(seed)
    next_id = [0]

    def fresh(k: int) -> list:
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    systems = {t: [fresh(b) for b in system_blocks] for t in range(tenants)}
    convs: list = []
    reqs: list = []
    t_ms = 0.0
    while len(reqs) < num_requests:
        t_ms += rng.expovariate(rate_per_s) * 1000.0
        if len(convs) < active or rng.random() < 0.05:
            tenant = rng.randrange(tenants)
            sys_ids = rng.choice(systems[tenant])
            conv = {"tenant": tenant, "ids": list(sys_ids), "len": len(sys_ids) * block_size,
                    "turns": 1 + int(rng.expovariate(1.0 / mean_turns))}
            if len(convs) >= active:
                convs.pop(rng.randrange(len(convs)))
            convs.append(conv)
        else:
            conv = rng.choice(convs)
        user = max(1, int(rng.lognormvariate(6.5, 1.0)))
        n_in = conv["len"] + user
        keep = conv["len"] // block_size          # full blocks of the previous prompt are shared
        ids = conv["ids"][:keep] + fresh(math.ceil(n_in / block_size) - keep)
        n_out = max(1, int(rng.lognormvariate(5.0, 0.8)))
        reqs.append(Request(int(t_ms), n_in, n_out, tuple(ids), f"tenant{conv['tenant']}"))
        conv["turns"] -= 1
        if conv["turns"] <= 0:
            convs.remove(conv)
        else:
            # the next prompt continues this one; its output extends the shared text
            conv["len"] = n_in + n_out
            conv["ids"] = ids[:n_in // block_size] + fresh(
                math.ceil((n_in + n_out) / block_size) - n_in // block_size)
    return Trace(f"synthetic-s{seed}", tuple(reqs), block_size)
