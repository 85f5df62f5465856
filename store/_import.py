"""Reading an export back into a store: check the whole file, then write it.

The file is decoded strictly, line by line, against the line types of
``_export_format`` (unknown fields and unknown schema versions refused),
its header first and its trailer's counts last, and every record line is
turned into the (database, key, value) it puts. Only a file that passes
all of it is written — through the store's writer, in as few transactions
as the size allows. A bad file raises ``RejectedInputError`` naming the
line and the field, and nothing is written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, NoReturn

import msgspec

from sessiontree.protocol import CorruptRecordError, RejectedInputError, StoreError
from sessiontree.store._batch import WriteBatch
from sessiontree.store._env import DATABASES, LIVE_INDEXED
from sessiontree.store._export_format import (
    ENCODER,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    LINE_DB,
    LINE_TYPES,
    RECORD_COUNTS,
    RECORD_DBS,
    AnyLine,
    EndLine,
    LinkLine,
    MainLine,
    MetaLine,
    OpaqueLine,
    PlatformIdLine,
    RecordLine,
    SessionLine,
    tag_of,
)
from sessiontree.store._keys import main_key, pair_key, platform_key
from sessiontree.store._live import stamp_of
from sessiontree.store._records import SCHEMA_VERSION, MetaRecord, decode_record, encode_record
from sessiontree.store._store import Store

__all__ = ["MAX_LINE_BYTES", "import_jsonl"]

MAX_LINE_BYTES = 256 << 20  # one line of an import; a store's values are never this large
_BATCH_BYTES = 256 << 20  # an import up to this size commits in one transaction
_MAX_KEY = 511  # LMDB's default maximum key size
_WRITE_TIMEOUT = 600.0  # seconds one import transaction may take before the import gives up
#: What a store "empty" for an import may hold: its identity, the derived index,
#: and its slot epochs (fencing state, never exported, kept by ``replace``).
_KEPT = ("meta", "live", "slots")

_LINE_DECODER: msgspec.json.Decoder[AnyLine] = msgspec.json.Decoder(AnyLine)


def import_jsonl(
    store: Store,
    source: str | os.PathLike[str] | IO[str] | IO[bytes],
    *,
    replace: bool = False,
) -> dict[str, int]:
    """Restore an export into ``store`` (open for writing); return lines read per type.

    ``source`` is a path or an open stream (text or binary). The whole file
    is decoded and checked first — strictly: each line against its type,
    unknown fields and unknown schema versions refused, the header first and
    the trailer's counts last — and only then written, in one transaction
    when under 256 MiB of values. The file's ``MetaRecord`` replaces the
    store's (``store.meta`` follows), so a restore keeps its identity.

    The store must hold nothing but its ``meta`` record (and slot epochs); with
    ``replace=True`` everything in it but those is deleted in the same
    transaction as the first writes (never beside a running node on that
    store). The store keeps its own ``incarnation`` and slot epochs.

    Raises ``RejectedInputError`` naming the line number and the field
    (``.field``) for a bad line, a truncated file or a file of a newer
    format; nothing is written then. ``StoreError`` when the store is
    read-only, not empty (without ``replace``) or cannot commit
    (``StoreFullError`` when the map is full): a one-transaction import
    wrote nothing; a larger one says how much it committed. ``OSError``
    when ``source`` cannot be read; ``TimeoutError`` when one transaction
    takes over ten minutes (it may still commit).
    """
    if store.readonly:
        msg = f"store {store.path} is open read-only; import needs the writer"
        raise StoreError(msg)
    if not replace:
        held = {db: n for db in DATABASES if db not in _KEPT and (n := store.count(db))}
        if held:
            listing = ", ".join(f"{n} {db}" for db, n in held.items())
            msg = (
                f"store {store.path} is not empty ({listing}); import into a new store "
                "or pass replace=True"
            )
            raise StoreError(msg)
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as handle:
            plan = _plan(handle)
    else:
        plan = _plan(source)
    if plan.meta is not None:
        # The file's identity, this open's incarnation (or the writer fences itself).
        held_at = store.meta.incarnation if store.meta is not None else 0
        plan.meta = msgspec.structs.replace(plan.meta, incarnation=held_at)
        meta = ("meta", b"meta", encode_record(plan.meta))
        plan.puts = [meta if put[:2] == meta[:2] else put for put in plan.puts]
    _commit(store, plan, replace=replace)
    if plan.meta is not None:
        store.meta = plan.meta
    store.slots.reload()  # the slots the file says moved away answer so from now on
    return plan.counts


@dataclass
class _Plan:
    puts: list[tuple[str, bytes, bytes]]
    counts: dict[str, int]
    meta: MetaRecord | None


def _plan(source: Iterable[str | bytes]) -> _Plan:
    """Decode and check every line; the puts to make, or ``RejectedInputError``."""
    puts: list[tuple[str, bytes, bytes]] = []
    seen: set[tuple[str, bytes]] = set()
    counts = dict.fromkeys(LINE_TYPES, 0)
    meta: MetaRecord | None = None
    ended = False
    number = 0
    for number, text in enumerate(source, start=1):
        data = text.encode() if isinstance(text, str) else bytes(text)
        line = _decode_line(number, data)
        tag = tag_of(line)
        if ended:
            _reject(number, "a line after the end line (two exports in one file?)", "type")
        if number == 1 and not isinstance(line, MetaLine):
            _reject(number, f"starts with a {tag} line, not meta: not a sessiontree export", "type")
        if isinstance(line, EndLine):
            _check_end(number, line, counts)
            counts[tag] += 1
            ended = True
            continue
        if isinstance(line, MetaLine):
            if number != 1:
                _reject(number, "a second meta line", "type")
            meta = _check_meta(number, line)
            entry = (
                None
                if line.record is None
                else ("meta", b"meta", _record_bytes(number, line, b"meta"))
            )
        else:
            entry = _entry(number, line)
        counts[tag] += 1
        if entry is None:
            continue
        db, key, _ = entry
        if not 0 < len(key) <= _MAX_KEY:
            _reject(number, f"a key of {len(key)} bytes (LMDB takes 1..{_MAX_KEY})", "key")
        if (db, key) in seen:
            _reject(number, f"a second entry for {db} key {key.hex()}", "type")
        seen.add((db, key))
        puts.append(entry)
        if isinstance(line, SessionLine) and not line.record.info.state.is_terminal:
            puts.append(("live", key, b""))  # the index of live sessions, derived
    if number == 0:
        _reject(1, "the file is empty", None)
    if not ended:
        _reject(number, "no end line: the file is truncated", None)
    return _Plan(puts, {name: n for name, n in counts.items() if n}, meta)


def _reject(number: int, problem: str, field: str | None) -> NoReturn:
    where = f" ({field})" if field else ""
    msg = f"line {number}{where}: {problem}"
    raise RejectedInputError(msg, field=field)


_PATH = re.compile(r" - at `\$\.?(.*)`$")
_NAMED = re.compile(r"field `([^`]+)`")


def _field_of(exc: msgspec.ValidationError) -> str | None:
    """The dotted path msgspec names in ``exc`` (``record.info.state``), if any."""
    text = str(exc)
    path = _PATH.search(text)
    parts = [path.group(1)] if path is not None and path.group(1) else []
    named = _NAMED.search(text)
    if named is not None:
        parts.append(named.group(1))
    return ".".join(parts) or None


def _decode_line(number: int, data: bytes) -> AnyLine:
    if len(data) > MAX_LINE_BYTES:
        _reject(number, f"{len(data)} bytes, over the cap of {MAX_LINE_BYTES}", None)
    if not data.strip():
        _reject(number, "an empty line", None)
    try:
        return _LINE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        field = _field_of(exc)
        where = f" ({field})" if field else ""
        msg = f"line {number}{where}: {exc}"
        raise RejectedInputError(msg, field=field) from exc
    except msgspec.DecodeError as exc:
        msg = f"line {number}: not JSON: {exc}"
        raise RejectedInputError(msg) from exc
    except RecursionError as exc:
        msg = f"line {number}: nested too deeply"
        raise RejectedInputError(msg) from exc


def _check_meta(number: int, line: MetaLine) -> MetaRecord | None:
    if line.format != EXPORT_FORMAT:
        _reject(number, f"format {line.format!r}, not {EXPORT_FORMAT!r}", "format")
    if not 2 <= line.version <= EXPORT_VERSION:  # 3, 4 and 5 only added line types
        problem = f"export format version {line.version}; this code reads 2..{EXPORT_VERSION}"
        _reject(number, problem, "version")
    if not 1 <= line.schema <= SCHEMA_VERSION:
        _reject(
            number, f"schema version {line.schema}; this code reads 1..{SCHEMA_VERSION}", "schema"
        )
    if line.raw is not None and line.record is None:
        _reject(number, "raw without a record", "raw")
    return line.record


def _check_end(number: int, line: EndLine, counts: dict[str, int]) -> None:
    expected = {name: counts[name] for name in RECORD_COUNTS}
    if line.counts != expected:
        _reject(
            number,
            f"the end line counts {line.counts}, the file holds {expected} (truncated or edited?)",
            "counts",
        )


def _entry(number: int, line: AnyLine) -> tuple[str, bytes, bytes]:
    """The (db, key, value) a line puts; ``RejectedInputError`` when it cannot."""
    if isinstance(line, LinkLine):
        return "children", pair_key(line.parent, line.child), b""
    if isinstance(line, MainLine):
        return "mains", main_key(line.agent_id, line.key), line.session_id.bytes
    if isinstance(line, PlatformIdLine):
        if not line.platform_id:
            _reject(number, "an empty platform id", "platform_id")
        key = platform_key(line.session_id, line.platform_id)
        return "platform_ids", key, line.message_id.bytes
    if isinstance(line, OpaqueLine):
        if line.db not in DATABASES:
            _reject(number, f"unknown database {line.db!r}", "db")
        return line.db, line.key, line.value
    assert not isinstance(line, MetaLine | EndLine)
    spec = RECORD_DBS[LINE_DB[type(line)]]
    try:
        key = spec.key_of(line)
    except (ValueError, OverflowError) as exc:  # an inbox seq outside 0..2**64-1
        _reject(number, f"no key for this record: {exc}", "record")
    return LINE_DB[type(line)], key, _record_bytes(number, line, key)


def _record_bytes(number: int, line: MetaLine | RecordLine, key: bytes) -> bytes:
    """The stored bytes of a record line: its ``raw`` once checked against the
    readable record, else the record encoded."""
    record = line.record
    assert record is not None
    version = getattr(record, "v", None)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        problem = f"schema version {version!r}; this code reads 1..{SCHEMA_VERSION}"
        _reject(number, problem, "record.v")
    if line.raw is None:
        return encode_record(record)
    db = "meta" if isinstance(line, MetaLine) else LINE_DB[type(line)]
    try:
        stored = decode_record(type(record), line.raw, db=db, key=key)
    except CorruptRecordError as exc:
        _reject(number, f"raw does not decode: {exc}", "raw")
    except RecursionError:
        _reject(number, "raw is nested too deeply", "raw")
    if ENCODER.encode(stored) != ENCODER.encode(record):
        _reject(number, "raw and record disagree (was the record edited?)", "record")
    return line.raw


def _commit(store: Store, plan: _Plan, *, replace: bool) -> None:
    batches = [WriteBatch()]
    if replace:
        for db in DATABASES:
            if db not in ("meta", "slots"):  # slot epochs only grow: a restore keeps them
                batches[0]._delete(db, b"", prefix=True)
        # the index is kept (the puts hold it): its stamp stays as it was
        batches[0].raw("live", LIVE_INDEXED, stamp_of(store) or b"")
    for db, key, value in plan.puts:
        if batches[-1].size >= _BATCH_BYTES:
            batches.append(WriteBatch())
        batches[-1].raw(db, key, value)
    for done, batch in enumerate(batches):
        try:
            store.write(batch, timeout=_WRITE_TIMEOUT)
        except StoreError as exc:
            if done == 0:
                raise
            msg = (
                f"import stopped after {done} of {len(batches)} transactions: {exc}; the "
                "store holds part of the file — import it again with replace=True"
            )
            raise StoreError(msg) from exc
