"""Writing an export: a store as canonical JSONL (the format: ``_export_format``).

**Beside a live node.** Export reads through ``Store.scan``: short read
transactions, so it never pins old pages for its whole run; the price is
that it is not one point-in-time snapshot — each entry is whole, but
entries of different databases may be a few commits apart. Export a
stopped node's store for an exact snapshot.

**Lossless** by checking, entry by entry: the rendered line is decoded
back and re-encoded (``_exact``); where that does not give the stored bytes
the line also carries ``raw``, and an entry that does not decode, or whose
key does not match its record, becomes an ``opaque`` line. An unreadable
entry never stops an export.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from sessiontree.protocol import CorruptRecordError
from sessiontree.store._env import DATABASES
from sessiontree.store._export_format import (
    ENCODER,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    LINE_TYPES,
    RECORD_COUNTS,
    RECORD_DBS,
    EndLine,
    Line,
    LinkLine,
    MainLine,
    MetaLine,
    OpaqueLine,
    PlatformIdLine,
    parent_of,
    tag_of,
)
from sessiontree.store._records import SCHEMA_VERSION, MetaRecord, decode_record, encode_record
from sessiontree.store._store import Store

__all__ = ["export_jsonl"]


def export_jsonl(store: Store, out: str | os.PathLike[str] | IO[str] | IO[bytes]) -> dict[str, int]:
    """Write ``store`` as canonical JSONL to ``out``; return lines written per type.

    ``out`` is a path or an open stream (text or binary). A path is written
    to a temporary file beside it (mode 0600), fsync'd and renamed over
    ``out``, so a reader sees the old file or the whole new one, never half
    of it; on any failure the temporary file is removed and ``out`` is left
    as it was. Works on a read-only ``Store`` (beside a running node).

    Raises ``OSError`` when the file cannot be written and ``StoreError``
    when the store is closed. Unreadable entries never stop an export: they
    become ``opaque`` lines.
    """
    if isinstance(out, str | os.PathLike):
        return _export_to_path(store, Path(out))
    if isinstance(out, io.TextIOBase):
        text = out
        return _write_lines(store, lambda data: text.write(data.decode()))
    binary: IO[Any] = out
    return _write_lines(store, binary.write)


def _export_to_path(store: Store, path: Path) -> dict[str, int]:
    directory = path.parent
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            counts = _write_lines(store, handle.write)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(directory)
    return counts


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (best effort: some file systems refuse a directory fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_lines(store: Store, write: Callable[[bytes], object]) -> dict[str, int]:
    counts = dict.fromkeys(LINE_TYPES, 0)
    for line in _lines(store):
        write(ENCODER.encode(line) + b"\n")
        counts[tag_of(line)] += 1
    return {name: n for name, n in counts.items() if n}


def _lines(store: Store) -> Iterator[Line]:
    counts = dict.fromkeys(RECORD_COUNTS, 0)
    meta_raw = next((raw for key, raw in store.scan("meta", b"meta") if key == b"meta"), None)
    header, meta_opaque = _header(meta_raw)
    yield header
    for db in DATABASES:
        if db == "live":
            continue  # derived from the sessions: an import writes it again
        if db == "slots":
            continue  # who may write a slot here (fencing), not the store's content
        for key, raw in store.scan(db):
            if db == "meta" and key == b"starts":
                continue  # the node's run history: a restore starts afresh
            if db == "meta" and key == b"meta":
                if meta_opaque is None:
                    continue
                line: Line = meta_opaque
            else:
                line = _render(db, key, raw)
            counts[tag_of(line)] += 1
            yield line
    yield EndLine(counts=counts)


def _header(raw: bytes | None) -> tuple[MetaLine, OpaqueLine | None]:
    line = MetaLine(
        format=EXPORT_FORMAT, version=EXPORT_VERSION, schema=SCHEMA_VERSION, record=None
    )
    if raw is None:
        return line, None
    try:
        record = decode_record(MetaRecord, raw, db="meta", key=b"meta")
        exact = _exact(MetaRecord, record, raw)
    except (CorruptRecordError, _NotRenderableError, RecursionError) as exc:
        return line, OpaqueLine(db="meta", key=b"meta", value=raw, reason=str(exc))
    line.record = record
    line.raw = None if exact else raw
    return line, None


class _NotRenderableError(Exception):
    """An entry JSON cannot carry (it becomes an ``opaque`` line)."""


def _exact(kind: type[msgspec.Struct], record: msgspec.Struct, raw: bytes) -> bool:
    """Whether ``record`` rendered as JSON imports back to exactly ``raw``;
    ``_NotRenderableError`` when it does not even import back."""
    try:
        back = msgspec.json.decode(ENCODER.encode(record), type=kind)
    except (msgspec.DecodeError, msgspec.EncodeError, TypeError, RecursionError) as exc:
        msg = f"{kind.__name__} does not survive JSON: {exc}"
        raise _NotRenderableError(msg) from exc
    return encode_record(back) == raw


def _render(db: str, key: bytes, raw: bytes) -> Line:
    try:
        if db == "children":
            return _render_link(key, raw)
        if db == "mains":
            return _render_main(key, raw)
        if db == "platform_ids":
            return _render_platform_id(key, raw)
        spec = RECORD_DBS.get(db)
        if spec is None:
            msg = f"no line type for database {db!r}"
            raise _NotRenderableError(msg)
        record = decode_record(spec.kind, raw, db=db, key=key)
        exact = _exact(spec.kind, record, raw)
        line = spec.to_line(key, record, None if exact else raw)
        if spec.key_of(line) != key:
            msg = f"key {key.hex()} does not match its record"
            raise _NotRenderableError(msg)
    except (
        CorruptRecordError,
        _NotRenderableError,
        ValueError,
        OverflowError,
        RecursionError,
    ) as exc:
        return OpaqueLine(db=db, key=key, value=raw, reason=str(exc))
    return line


def _render_link(key: bytes, raw: bytes) -> LinkLine:
    if raw:
        msg = f"a tree link with a value of {len(raw)} bytes"
        raise _NotRenderableError(msg)
    return LinkLine(parent=parent_of(key), child=uuid.UUID(bytes=key[16:]))


def _render_main(key: bytes, raw: bytes) -> MainLine:
    agent_id, sep, name = key.decode().partition("\x00")
    if not sep or len(raw) != 16:
        msg = "a mains entry that is not agent NUL key -> session id"
        raise _NotRenderableError(msg)
    return MainLine(agent_id=agent_id, key=name, session_id=uuid.UUID(bytes=raw))


def _render_platform_id(key: bytes, raw: bytes) -> PlatformIdLine:
    if len(key) <= 16 or len(raw) != 16:
        msg = "a platform_ids entry that is not session id + platform id -> message id"
        raise _NotRenderableError(msg)
    return PlatformIdLine(
        session_id=uuid.UUID(bytes=key[:16]),
        platform_id=key[16:].decode(),
        message_id=uuid.UUID(bytes=raw),
    )
