"""The disk kernel cache as files: sizes, and a checksum check of every entry.

Entry layout (csrc/jit/disk_cache.cpp, all integers little-endian): the magic
``RTCNORM1``; three strings, each a u32 length then bytes (the key text, the
lowered kernel name, the target); a u8 cubin flag; a u64 image size and the
image; then 40 hex characters, the SHA-1 of everything before them. An entry
lives in ``<cache dir>/sm_XX/<SHA-1 of the key text>.bin``; the loader treats
an entry as corrupt when any of this fails (and recompiles it).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

MAGIC = b"RTCNORM1"


@dataclass
class ArchUsage:
    arch: str
    entries: int
    bytes: int


def entry_files(root: str) -> list[str]:
    """Every ``sm_*/*.bin`` entry under ``root`` (lock and partial files excluded)."""
    out = []
    if not os.path.isdir(root):
        return out
    for arch in sorted(os.listdir(root)):
        d = os.path.join(root, arch)
        if arch.startswith("sm_") and os.path.isdir(d):
            out.extend(os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".bin"))
    return out


def usage(root: str) -> list[ArchUsage]:
    """Entries and bytes per arch folder (every file counts towards the bytes)."""
    rows = []
    if not os.path.isdir(root):
        return rows
    for arch in sorted(os.listdir(root)):
        d = os.path.join(root, arch)
        if not (arch.startswith("sm_") and os.path.isdir(d)):
            continue
        names = os.listdir(d)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in names if os.path.isfile(os.path.join(d, f)))
        rows.append(ArchUsage(arch, sum(f.endswith(".bin") for f in names), size))
    return rows


def check_entry(path: str) -> str | None:
    """None when the entry at ``path`` is intact, else what is wrong with it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return f"unreadable: {e.strerror}"
    if len(data) < len(MAGIC) + 40 or data[: len(MAGIC)] != MAGIC:
        return "bad magic (not an rtcnorm cache entry)"
    pos = len(MAGIC)
    strings = []
    try:
        for _ in range(3):
            (n,) = struct.unpack_from("<I", data, pos)
            pos += 4
            if pos + n > len(data):
                return "truncated"
            strings.append(data[pos : pos + n])
            pos += n
        pos += 1  # cubin flag
        (image_size,) = struct.unpack_from("<Q", data, pos)
        pos += 8
    except struct.error:
        return "truncated"
    body_end = pos + image_size
    if body_end + 40 != len(data):
        return f"size mismatch: {len(data)} bytes, the header implies {body_end + 40}"
    stored = data[body_end:].decode("ascii", errors="replace")
    if hashlib.sha1(data[:body_end]).hexdigest() != stored:
        return "checksum mismatch"
    if hashlib.sha1(strings[0]).hexdigest() + ".bin" != os.path.basename(path):
        return "file name does not match its key"
    return None


def verify(root: str) -> tuple[int, list[tuple[str, str]]]:
    """(entries checked, [(path, problem)] for the bad ones)."""
    files = entry_files(root)
    bad = [(p, why) for p in files if (why := check_entry(p)) is not None]
    return len(files), bad
