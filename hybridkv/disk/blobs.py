"""Reading a blob's header to decide what it is, and deleting blobs safely.

A blob is deleted only when it is ours to delete: an indexed entry the tier evicts or
discards, or a copy verified damaged in our own format -- and then only while its first
bytes are still the damaged ones we read, so a blob republished meanwhile by another
process survives.  Neither function holds the tier lock; ``Deleter`` releases the index's
claim on a key once its blob is gone."""
from typing import NamedTuple

from hybridkv.disk.backend import NotRegular, read_head
from hybridkv.disk.entry import ON_DISK, Entry
from hybridkv.disk.format import (HEADER_MAX, CorruptObject, OtherVersion, decode_header,
                                  file_name, key_of)


class Inspected(NamedTuple):
    verdict: str          # "ok" | "missing" | "not_regular" | "other_version" | "io" | "corrupt"
    entry: Entry = None   # an on_disk Entry when "ok"
    head: bytes = None    # the header bytes read (what a deletion re-checks)


def inspect_blob(backend, name):
    """What the blob ``name`` is, from its header alone.  Never raises, never deletes."""
    key, head = key_of(name), None
    try:
        head = bytes(read_head(backend, name, HEADER_MAX))
        hdr = decode_header(head)
        size = backend.size(name)
        if hdr.key != key or size < hdr.payload_off + hdr.payload_len:
            raise CorruptObject("header/name or length mismatch", name)
    except FileNotFoundError:
        return Inspected("missing")
    except NotRegular:
        return Inspected("not_regular")
    except OtherVersion:
        return Inspected("other_version")
    except CorruptObject:
        return Inspected("corrupt", None, head)
    except OSError:
        return Inspected("io")
    return Inspected("ok", Entry(key, ON_DISK, size, hdr), head)


def remove_if_unchanged(backend, name, head):
    """Delete ``name`` only while its first bytes still equal ``head``; True when deleted.
    Raises OSError."""
    try:
        now = bytes(read_head(backend, name, HEADER_MAX))
    except FileNotFoundError:
        return False
    if now != head:
        return False
    backend.remove(name)
    return True


class Deleter:
    """Deletes the blobs the index decided to drop, outside the tier lock."""

    def __init__(self, backend, index, stats):
        self.backend, self.index, self.stats = backend, index, stats

    def remove(self, keys):
        """Delete the blobs of ``keys`` (claimed in index.removing), then release them."""
        for key in keys:
            try:
                self.backend.remove(file_name(key))
            except OSError:
                self.stats["remove_errors"] += 1
        self._release(keys)

    def remove_corrupt(self, key, head, claimed):
        """Delete a copy verified damaged, unless it changed since (see module doc)."""
        try:
            self.stats["corrupt_removed"] += remove_if_unchanged(self.backend,
                                                                 file_name(key), head)
        except OSError:
            self.stats["remove_errors"] += 1
        if claimed:
            self._release([key])

    def _release(self, keys):
        if keys:
            with self.index.lock:
                self.index.released(keys)
