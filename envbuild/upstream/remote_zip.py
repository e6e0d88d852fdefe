"""One member of a zip file read through range requests: the tail (end records), the
central directory (or just the end of it that holds the member), then the member itself.
Zip64 aware; stored and deflated members only."""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class ZipFormatError(ValueError):
    """The bytes read are not the zip structure they should be."""


EOCD = struct.Struct("<4s4H2LH")  # end of central directory, 22 bytes
ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes, just before the EOCD
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # 56 bytes
CENTRAL = struct.Struct("<4s6H3L5H2L")  # 46 bytes + name + extra + comment
LOCAL = struct.Struct("<4s5H3L2H")  # 30 bytes + name + extra
MAX_MEMBER_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ZipMember:
    name: str
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int
    extra_length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CentralDirectory:
    offset: int
    size: int


TailReader = Callable[[int], tuple[bytes, int]]  # n → (last n bytes, file size)
RangeReader = Callable[[int, int], bytes]  # [start, end) → bytes


def read_zip_member(
    *, tail: TailReader, read: RangeReader, tail_bytes: int, wanted: re.Pattern[str]
) -> bytes:
    """The content of the one member whose name fully matches ``wanted``."""
    data, total = tail(tail_bytes + EOCD.size)
    tail_start = total - len(data)
    directory = find_central_directory(data, tail_start, read)
    member = _find_member(data, tail_start, directory, read, wanted)
    return _read_member(member, directory, read)


def find_central_directory(data: bytes, tail_start: int, read: RangeReader) -> CentralDirectory:
    """Locate the central directory from the end records (zip64 aware)."""
    pos = _eocd_position(data)
    fields = EOCD.unpack_from(data, pos)
    entries, size, offset = fields[4], fields[5], fields[6]
    if entries != 0xFFFF and 0xFFFFFFFF not in (size, offset):
        return CentralDirectory(offset=offset, size=size)
    locator_start = tail_start + pos - ZIP64_LOCATOR.size
    locator = _slice_or_read(data, tail_start, locator_start, ZIP64_LOCATOR.size, read)
    signature, _, record_offset, _ = ZIP64_LOCATOR.unpack(locator)
    if signature != b"PK\x06\x07":
        raise ZipFormatError("zip64 end-of-directory locator missing")
    record = _slice_or_read(data, tail_start, record_offset, ZIP64_EOCD.size, read)
    fields64 = ZIP64_EOCD.unpack(record)
    if fields64[0] != b"PK\x06\x06":
        raise ZipFormatError("zip64 end-of-directory record missing")
    return CentralDirectory(offset=fields64[9], size=fields64[8])


def _eocd_position(data: bytes) -> int:
    # The EOCD is followed only by its comment; check that, since a comment may hold PK\5\6.
    pos = data.rfind(b"PK\x05\x06")
    while pos != -1:
        if pos + EOCD.size <= len(data):
            comment_length = EOCD.unpack_from(data, pos)[7]
            if pos + EOCD.size + comment_length == len(data):
                return pos
        pos = data.rfind(b"PK\x05\x06", 0, pos)
    raise ZipFormatError("no end-of-central-directory record (not a zip file?)")


def _slice_or_read(
    data: bytes, tail_start: int, start: int, length: int, read: RangeReader
) -> bytes:
    """Bytes [start, start + length): from the tail already read when it holds them."""
    if start < 0:
        raise ZipFormatError("zip structure points before the start of the file")
    if start >= tail_start:
        chunk = data[start - tail_start : start - tail_start + length]
        if len(chunk) == length:
            return chunk
    return read(start, start + length)


def _find_member(
    data: bytes,
    tail_start: int,
    directory: CentralDirectory,
    read: RangeReader,
    wanted: re.Pattern[str],
) -> ZipMember:
    end = directory.offset + directory.size
    if end > tail_start + len(data):
        raise ZipFormatError("central directory runs past the end of the file")
    if directory.offset >= tail_start:
        members = parse_central_directory(data[directory.offset - tail_start : end - tail_start])
        return _only_match(members, wanted)
    # A torch wheel's directory is ~1 MB, but *.dist-info sits at one of its ends: last
    # when the wheel was built by the usual tools, first when it was repacked. Look at
    # the end already read, then at the start, and only then read the whole directory.
    partial = data[: end - tail_start]
    found = _matches(members_from_partial_directory(partial), wanted)
    if found:
        return _only_match(found, wanted)
    head_end = min(directory.offset + len(data), tail_start)
    head = read(directory.offset, head_end)
    found = _matches(members_from_directory_start(head), wanted)
    if found:
        return _only_match(found, wanted)
    middle = read(head_end, tail_start) if head_end < tail_start else b""
    return _only_match(parse_central_directory(head + middle + partial), wanted)


def _matches(members: Iterable[ZipMember] | None, wanted: re.Pattern[str]) -> list[ZipMember]:
    return [m for m in members or () if wanted.fullmatch(m.name)]


def _only_match(members: Iterable[ZipMember], wanted: re.Pattern[str]) -> ZipMember:
    found = [m for m in members if wanted.fullmatch(m.name)]
    if len(found) != 1:
        raise ZipFormatError(f"expected one member matching {wanted.pattern}, found {len(found)}")
    return found[0]


def parse_central_directory(data: bytes, start: int = 0) -> list[ZipMember]:
    """Every entry from ``start`` to the exact end of ``data``."""
    members: list[ZipMember] = []
    pos = start
    while pos < len(data):
        member, pos = _central_entry(data, pos)
        members.append(member)
    if pos != len(data):
        raise ZipFormatError("central directory entries overrun the directory")
    return members


def members_from_directory_start(head: bytes) -> list[ZipMember]:
    """The complete entries at the start of a directory that ``head`` holds only part of."""
    members: list[ZipMember] = []
    pos = 0
    while True:
        try:
            member, pos = _central_entry(head, pos)
        except ZipFormatError:
            return members
        members.append(member)


def members_from_partial_directory(partial: bytes) -> list[ZipMember] | None:
    """Entries of a directory's tail: the first signature whose chain ends exactly at the end."""
    pos = partial.find(b"PK\x01\x02")
    while pos != -1:
        try:
            return parse_central_directory(partial, pos)
        except (ZipFormatError, struct.error, UnicodeDecodeError):
            pos = partial.find(b"PK\x01\x02", pos + 1)
    return None


def _central_entry(data: bytes, pos: int) -> tuple[ZipMember, int]:
    if pos + CENTRAL.size > len(data):
        raise ZipFormatError("truncated central directory entry")
    fields = CENTRAL.unpack_from(data, pos)
    if fields[0] != b"PK\x01\x02":
        raise ZipFormatError("bad central directory signature")
    flags, method, crc, compressed, size = fields[3], fields[4], fields[7], fields[8], fields[9]
    name_length, extra_length, comment_length = fields[10:13]
    offset = fields[16]
    name_start = pos + CENTRAL.size
    extra_start = name_start + name_length
    next_pos = extra_start + extra_length + comment_length
    if next_pos > len(data):
        raise ZipFormatError("truncated central directory entry")
    # Bit 11: the name is UTF-8; otherwise cp437 (zip's historical default).
    name = data[name_start:extra_start].decode("utf-8" if flags & 0x800 else "cp437")
    size, compressed, offset = _zip64_values(
        data[extra_start : extra_start + extra_length], size, compressed, offset
    )
    member = ZipMember(
        name=name,
        flags=flags,
        method=method,
        crc=crc,
        compressed_size=compressed,
        size=size,
        header_offset=offset,
        extra_length=extra_length,
    )
    return member, next_pos


def _zip64_values(extra: bytes, size: int, compressed: int, offset: int) -> tuple[int, int, int]:
    """Replace 0xFFFFFFFF placeholders from the zip64 extra field (id 1), in its fixed order."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if tag != 1:
            continue
        values = [v for (v,) in struct.iter_unpack("<Q", body[: len(body) // 8 * 8])]
        if size == 0xFFFFFFFF and values:
            size = values.pop(0)
        if compressed == 0xFFFFFFFF and values:
            compressed = values.pop(0)
        if offset == 0xFFFFFFFF and values:
            offset = values.pop(0)
    return size, compressed, offset


def _read_member(member: ZipMember, directory: CentralDirectory, read: RangeReader) -> bytes:
    if member.flags & 0x1:
        raise ZipFormatError(f"{member.name} is encrypted")
    if member.size > MAX_MEMBER_BYTES or member.compressed_size > MAX_MEMBER_BYTES:
        raise ZipFormatError(f"{member.name} is implausibly large ({member.size} bytes)")
    start = member.header_offset
    # The local header's extra field usually matches the central one; read both in one go.
    guess = LOCAL.size + len(member.name.encode()) + member.extra_length + member.compressed_size
    chunk = read(start, min(start + guess, directory.offset))
    if len(chunk) < LOCAL.size or chunk[:4] != b"PK\x03\x04":
        raise ZipFormatError(f"bad local header for {member.name}")
    name_length, extra_length = LOCAL.unpack_from(chunk)[9:11]
    data_start = LOCAL.size + name_length + extra_length
    needed = data_start + member.compressed_size
    if len(chunk) < needed:
        chunk += read(start + len(chunk), start + needed)
    return _inflate(member, chunk[data_start:needed])


def _inflate(member: ZipMember, raw: bytes) -> bytes:
    if member.method == 0:
        content = raw
    elif member.method == 8:
        try:
            inflater = zlib.decompressobj(-15)
            content = inflater.decompress(raw, MAX_MEMBER_BYTES) + inflater.flush()
        except zlib.error as exc:
            raise ZipFormatError(f"{member.name}: {exc}") from exc
    else:
        raise ZipFormatError(f"{member.name}: unsupported compression method {member.method}")
    if len(content) != member.size or zlib.crc32(content) != member.crc:
        raise ZipFormatError(f"{member.name}: size or CRC mismatch")
    return content
