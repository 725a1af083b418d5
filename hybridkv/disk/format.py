"""On-disk object format: a checksummed header, then the payload at a DISK_ALIGN offset.

    [0:16)   struct "<8sHHI": magic, format version, reserved (0), JSON length n
    [16:16+n)              UTF-8 JSON of the header fields (no pickle, ever)
    [16+n:32+n)            xxh3_128 digest of bytes [0:16+n)  (catches header bit flips)
    zeros up to payload_off (a multiple of DISK_ALIGN), then payload_len raw bytes

The payload checksum (xxh3_128, hex) lives in the JSON; it is verified before any byte
reaches a caller's tensor.  File names come only from validated hex keys.
"""
import json
import math
import re
import struct
import time
from typing import NamedTuple

import torch
import xxhash

from spec.funnel import DISK_ALIGN

MAGIC = b"HYBRIDKV"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sHHI")
HEADER_MAX = 4 * DISK_ALIGN          # a header never exceeds this many bytes
SUFFIX = ".hkv"
KINDS = ("compressed_kv", "tail", "swa", "indexer")
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}
_KEY_RE = re.compile(r"[0-9a-f]{16,64}")


class DiskError(Exception):
    """Base of every named disk-tier error."""


class BadInput(DiskError, ValueError):
    """Caller passed something the tier cannot store; carries the offending value."""

    def __init__(self, what, value):
        super().__init__(f"{what}: {value!r}")
        self.what, self.value = what, value


class BadKey(BadInput):
    def __init__(self, key):
        super().__init__("key must be 16..64 lowercase hex chars", key)


class CorruptObject(DiskError):
    """A stored object failed verification; the tier turns this into a miss."""

    def __init__(self, reason, value=None):
        super().__init__(f"{reason}: {value!r}")
        self.reason, self.value = reason, value


class OtherVersion(DiskError):
    """A blob of another format version (magic ours, version not): written by an older or
    newer process sharing the directory or Redis prefix.  Not damage: it is never indexed,
    never loaded and never deleted.  (A bit flip in the version field looks the same, so
    such a blob is kept too: it costs space, never correctness.)"""

    def __init__(self, version):
        super().__init__(f"blob of format version {version}, ours is {FORMAT_VERSION}")
        self.version = version


class DiskMeta(NamedTuple):
    """What the caller says an object is.  abi: integer layout/ABI id (see abi_id)."""
    kind: str
    abi: int
    tok_lo: int = 0
    tok_hi: int = 0


class Header(NamedTuple):
    key: str
    kind: str
    abi: int
    dtype: str
    shape: tuple
    tok_lo: int
    tok_hi: int
    payload_off: int
    payload_len: int
    payload_ck: str
    t_ns: int


def validate_key(key):
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise BadKey(key)
    return key


def file_name(key):
    return validate_key(key) + SUFFIX


def key_of(name):
    """The key a published file name encodes, or None for anything else."""
    if not name.endswith(SUFFIX):
        return None
    k = name[: -len(SUFFIX)]
    return k if _KEY_RE.fullmatch(k) else None


def abi_id(desc):
    """Stable 63-bit id of an spec.funnel.AbiDesc (or any tuple of plain values)."""
    return xxhash.xxh3_64_intdigest(json.dumps(list(desc), default=list).encode()) >> 1


def checksum(buf):
    return xxhash.xxh3_128_hexdigest(buf)


def align_up(n, a=DISK_ALIGN):
    return -(-n // a) * a


def check_meta(meta):
    if not isinstance(meta, DiskMeta):
        raise BadInput("meta must be a DiskMeta", meta)
    if meta.kind not in KINDS:
        raise BadInput("unknown object kind", meta.kind)
    for f in ("abi", "tok_lo", "tok_hi"):
        v = getattr(meta, f)
        if type(v) is not int or v < 0 or v >= 2 ** 63:
            raise BadInput(f"{f} must be a non-negative int64", v)
    if meta.tok_lo > meta.tok_hi:
        raise BadInput("tok_lo > tok_hi", (meta.tok_lo, meta.tok_hi))


def check_tensor(t):
    """A strided tensor with real storage (any device but "meta"), or BadInput."""
    if not isinstance(t, torch.Tensor):
        raise BadInput("object must be a torch.Tensor", type(t).__name__)
    if t.layout is not torch.strided or t.device.type == "meta":
        raise BadInput("tensor must be strided with storage", (t.layout, t.device.type))
    return t


def check_timeout(timeout):
    """None (wait forever) or a finite number of seconds >= 0, else BadInput."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout < 0:
        raise BadInput("timeout must be None or a finite number >= 0", timeout)
    return timeout


def dtype_name(t):
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise BadInput("unsupported dtype", t.dtype)
    return name


def encode_header(key, meta, tensor, payload_ck):
    """Header bytes padded to the payload offset.  Raises BadInput on bad arguments."""
    check_meta(meta)
    nbytes = tensor.numel() * tensor.element_size()
    body = {"key": validate_key(key), "kind": meta.kind, "abi": meta.abi,
            "dtype": dtype_name(tensor), "shape": list(tensor.shape), "tok_lo": meta.tok_lo,
            "tok_hi": meta.tok_hi, "payload_len": nbytes, "payload_ck": payload_ck,
            "t_ns": time.time_ns()}
    body["payload_off"] = HEADER_MAX  # widest value: the real JSON is never longer
    js = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    body["payload_off"] = align_up(_PREFIX.size + len(js) + 16)
    js = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(js)) + js
    head += xxhash.xxh3_128_digest(head)
    if len(head) > body["payload_off"] or body["payload_off"] > HEADER_MAX:
        raise BadInput("header too large", len(head))
    return head + bytes(body["payload_off"] - len(head))


def _int(body, f, lo=0, hi=2 ** 63):
    v = body.get(f)
    if type(v) is not int or not lo <= v < hi:
        raise CorruptObject(f"header field {f}", v)
    return v


def decode_header(buf):
    """Parse and verify a header from the first bytes of a file.  Raises OtherVersion for
    another format version, CorruptObject for any damage."""
    buf = bytes(buf[:HEADER_MAX])
    if len(buf) < _PREFIX.size:
        raise CorruptObject("truncated header", len(buf))
    magic, ver, _res, n = _PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise CorruptObject("bad magic", magic)
    if ver != FORMAT_VERSION:
        raise OtherVersion(ver)       # its layout is not ours to judge: never "corrupt"
    end = _PREFIX.size + n
    if end + 16 > len(buf):
        raise CorruptObject("truncated header", len(buf))
    if xxhash.xxh3_128_digest(buf[:end]) != buf[end:end + 16]:
        raise CorruptObject("header checksum mismatch")
    try:
        body = json.loads(buf[_PREFIX.size:end].decode())
    except (UnicodeDecodeError, ValueError) as e:  # unreachable unless the digest collides
        raise CorruptObject("header JSON", str(e)) from None
    if not isinstance(body, dict):
        raise CorruptObject("header JSON not an object", type(body).__name__)
    kind, dtype, shape = body.get("kind"), body.get("dtype"), body.get("shape")
    if kind not in KINDS:
        raise CorruptObject("header kind", kind)
    if dtype not in DTYPES:
        raise CorruptObject("header dtype", dtype)
    if not isinstance(shape, list) or not all(type(s) is int and 0 <= s < 2 ** 40 for s in shape):
        raise CorruptObject("header shape", shape)
    key, ck = body.get("key"), body.get("payload_ck")
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise CorruptObject("header key", key)
    if not isinstance(ck, str) or re.fullmatch(r"[0-9a-f]{32}", ck) is None:
        raise CorruptObject("header payload checksum", ck)
    h = Header(key, kind, _int(body, "abi"), dtype, tuple(shape), _int(body, "tok_lo"),
               _int(body, "tok_hi"), _int(body, "payload_off"), _int(body, "payload_len"),
               ck, _int(body, "t_ns"))
    numel = 1
    for s in h.shape:
        numel *= s
    if h.payload_len != numel * DTYPES[dtype].itemsize:
        raise CorruptObject("payload length disagrees with shape", h.payload_len)
    if h.payload_off < end + 16 or h.tok_lo > h.tok_hi:
        raise CorruptObject("header ranges", (h.payload_off, h.tok_lo, h.tok_hi))
    return h


def tensor_bytes(t):
    """A zero-copy uint8 view of a CPU tensor (contiguous copy if needed) as a memoryview."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
