import os
import pathlib

import pytest
import torch

from hybridkv.disk import format as fmt
from hybridkv.disk.format import BadInput, BadKey, CorruptObject, DiskMeta, OtherVersion
from spec.funnel import DISK_ALIGN, AbiDesc

KEY = "0123456789abcdef" * 2
META = DiskMeta("indexer", abi=5, tok_lo=128, tok_hi=256)


def _blob(t=None):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4) if t is None else t
    payload = fmt.tensor_bytes(t)
    head = fmt.encode_header(KEY, META, t, fmt.checksum(payload))
    return head, bytes(payload)


def test_header_roundtrip_and_alignment():
    head, payload = _blob()
    h = fmt.decode_header(head)
    assert len(head) == h.payload_off and h.payload_off % DISK_ALIGN == 0
    assert (h.key, h.kind, h.abi, h.dtype, h.shape, h.tok_lo, h.tok_hi) == \
        (KEY, "indexer", 5, "float32", (3, 4), 128, 256)
    assert h.payload_len == len(payload) == 48 and h.payload_ck == fmt.checksum(payload)


@pytest.mark.parametrize("dtype", sorted(fmt.DTYPES))
def test_every_dtype_encodes(dtype):
    t = torch.zeros(2, 3).to(fmt.DTYPES[dtype])
    head, payload = _blob(t)
    h = fmt.decode_header(head)
    assert h.dtype == dtype and h.payload_len == len(payload) == 6 * t.element_size()


def test_every_single_bit_flip_in_header_is_rejected():
    """Damage anywhere is CorruptObject, except in the version field (bytes 8-9), where
    it is indistinguishable from another format version: OtherVersion (kept, not used)."""
    head, _ = _blob()
    end = 16 + int.from_bytes(head[12:16], "little") + 16
    for i in range(end):
        for bit in range(8):
            bad = bytearray(head)
            bad[i] ^= 1 << bit
            with pytest.raises(OtherVersion if i in (8, 9) else CorruptObject):
                fmt.decode_header(bad)


@pytest.mark.parametrize("n", [0, 5, 16, 40, 200])
def test_truncated_header_rejected(n):
    head, _ = _blob()
    with pytest.raises(CorruptObject):
        fmt.decode_header(head[:n])


@pytest.mark.parametrize("key", ["", "ABCDEF0123456789", "0123", "../../etc/passwd",
                                 "0123456789abcdef/x", "g" * 32, "a" * 65, 12345, None,
                                 "0123456789abcdef\n"])
def test_bad_keys_raise_named_error(key):
    with pytest.raises(BadKey) as e:
        fmt.file_name(key)
    assert e.value.value == key


@pytest.mark.parametrize("meta", [DiskMeta("weights", 1), DiskMeta("swa", -1),
                                  DiskMeta("swa", 1, 5, 4), DiskMeta("swa", 1.5), ("swa", 1)])
def test_bad_meta_raises(meta):
    with pytest.raises(BadInput):
        fmt.encode_header(KEY, meta, torch.zeros(1), "0" * 32)


def test_unsupported_dtype_raises():
    with pytest.raises(BadInput):
        fmt.encode_header(KEY, META, torch.zeros(2, dtype=torch.complex64), "0" * 32)


def test_key_of_accepts_only_published_hex_names():
    assert fmt.key_of(KEY + ".hkv") == KEY
    for n in (KEY, ".tmp-1-2-3", KEY.upper() + ".hkv", "x.hkv"):
        assert fmt.key_of(n) is None


def test_abi_id_distinguishes_descriptors():
    a = AbiDesc("float32", "paged", (64, 1), 16, 64, 1)
    assert fmt.abi_id(a) == fmt.abi_id(AbiDesc(*a))
    assert fmt.abi_id(a) != fmt.abi_id(a._replace(kernel_version=2))
    assert 0 <= fmt.abi_id(a) < 2 ** 63


def test_no_pickle_or_torch_load_in_disk_package():
    root = pathlib.Path(__file__).resolve().parents[2] / "hybridkv" / "disk"
    for p in root.glob("*.py"):
        src = p.read_text()
        assert "import pickle" not in src and "torch.load" not in src, p
    assert os.path.isdir(root)
