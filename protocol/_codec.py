"""Strict decoding of untrusted bytes: size cap first, then a typed decode."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from sessiontree.protocol._errors import RejectedInputError
from sessiontree.protocol._messages import ControlMessage, SpawnCmd
from sessiontree.protocol._specs import SpawnSpec

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_INPUT_BYTES",
    "MAX_INPUT_NESTING",
    "MAX_NESTING",
    "decode_control",
    "decode_strict",
    "encode_json",
    "make_spec",
    "plain_input",
    "spawn_batch",
]

T = TypeVar("T")

MAX_CONTROL_BYTES = 1 << 20
MAX_NESTING = 64
# A spawn's structured input, encoded: a quarter of a control message, so a
# spawn body holding it and a task and context summary at their caps fits one;
# half the nesting, so a session's info still decodes inside a tree view.
MAX_INPUT_BYTES = MAX_CONTROL_BYTES // 4
MAX_INPUT_NESTING = MAX_NESTING // 2

_json_control = msgspec.json.Decoder(ControlMessage)
_msgpack_control = msgspec.msgpack.Decoder(ControlMessage)
_PATH = re.compile(r"`\$([^`]*)`$")  # "at `$.ttl`", "at `key` in `$.metadata`"
_JSON_NOISE = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _nesting(data: bytes) -> int:
    """Deepest bracket nesting of a JSON document, strings ignored."""
    depth = deepest = 0
    for byte in _JSON_NOISE.sub(b'""', data):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """The path (``input.rows[2]``) and value of the first NaN or infinity in
    plain data ``value`` (dicts and lists, already bounded in depth), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        for key, item in value.items():
            step = f".{key}" if isinstance(key, str) and _NAME.fullmatch(key) else f"[{key!r}]"
            found = _non_finite(item, path + step)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _non_finite(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _refuse_non_finite(path: str, number: float) -> RejectedInputError:
    msg = f"{path} is {number!r}: numbers must be finite (JSON has no NaN or infinity)"
    return RejectedInputError(msg, field=path)


def _non_finite_in_json(data: bytes) -> RejectedInputError | None:
    """For a payload msgspec found malformed: the refusal naming the field that
    holds a ``NaN``, ``Infinity`` or a number past a float's range (which
    Python's own JSON reader takes), or None when that is not what is wrong."""
    try:
        loose = json.loads(bytes(data))
    except (ValueError, RecursionError):
        return None
    found = _non_finite(loose, "$")
    if found is None:
        return None
    path, number = found
    return _refuse_non_finite(path.removeprefix("$").lstrip(".") or "$", number)


_MISSING = re.compile(r"(?:missing required|contains unknown) field `([^`]+)`")


def _field_of(error: msgspec.ValidationError) -> str | None:
    """The field msgspec's error names: its path, plus a missing or unknown field's name."""
    text = str(error)
    match = _PATH.search(text)
    path = match.group(1).lstrip(".") if match else ""
    missing = _MISSING.search(text)
    if missing is not None:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def decode_strict(
    data: bytes,
    decoder: msgspec.json.Decoder[T] | msgspec.msgpack.Decoder[T],
    *,
    max_bytes: int = MAX_CONTROL_BYTES,
) -> T:
    """Decode untrusted ``data`` with ``decoder`` after checking its size.

    Raises ``RejectedInputError`` (naming the field where msgspec says which)
    when the payload is too large, (JSON) nested deeper than ``MAX_NESTING``,
    malformed, has unknown fields or fields of the wrong type. Nothing is
    coerced: ``"5"`` is not a float. A JSON ``NaN``, ``Infinity`` or number
    past a float's range is refused naming the field that holds it
    (``input.rows[2]``), not as merely malformed.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        msg = f"payload must be bytes, not {type(data).__name__}"
        raise RejectedInputError(msg, reason="malformed")
    if len(data) > max_bytes:
        msg = f"payload of {len(data)} bytes is over the cap of {max_bytes}"
        raise RejectedInputError(msg, reason="too_large")
    if isinstance(decoder, msgspec.json.Decoder) and _nesting(bytes(data)) > MAX_NESTING:
        msg = f"payload is nested deeper than {MAX_NESTING} levels"
        raise RejectedInputError(msg, reason="too_deep")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        if "Number out of range" in str(exc):  # 1e400: name the field, not "input[...]"
            named = _non_finite_in_json(data) if isinstance(decoder, msgspec.json.Decoder) else None
            if named is not None:
                raise named from exc
        reason = "unknown_field" if "Object contains unknown field" in str(exc) else "invalid_field"
        raise RejectedInputError(
            f"invalid payload: {exc}", field=_field_of(exc), reason=reason
        ) from exc
    except msgspec.DecodeError as exc:
        named = _non_finite_in_json(data) if isinstance(decoder, msgspec.json.Decoder) else None
        if named is not None:
            raise named from exc
        raise RejectedInputError(f"malformed payload: {exc}", reason="malformed") from exc
    except RejectedInputError:
        raise
    except RecursionError as exc:
        raise RejectedInputError(f"invalid payload: {exc}", reason="too_deep") from exc
    except (ValueError, TypeError) as exc:
        raise RejectedInputError(f"invalid payload: {exc}") from exc


def decode_control(data: bytes, *, fmt: str = "json") -> ControlMessage:
    """Decode one control command (JSON or msgpack); see ``decode_strict`` for
    errors. A spawn's ``input`` is checked as ``make_spec`` checks it (the
    error names ``spec.input``)."""
    decoder: msgspec.json.Decoder[ControlMessage] | msgspec.msgpack.Decoder[ControlMessage]
    if fmt == "json":
        decoder = _json_control
    elif fmt == "msgpack":
        decoder = _msgpack_control
    else:
        msg = f"unknown format {fmt!r} (json or msgpack)"
        raise RejectedInputError(msg, field="fmt")
    command = decode_strict(data, decoder)
    if isinstance(command, SpawnCmd) and command.spec.input is not None:
        try:
            plain = plain_input(command.spec.input)
        except RejectedInputError as exc:
            field = f"spec.{exc.field or 'input'}"
            raise RejectedInputError(str(exc), field=field, reason=exc.reason) from exc
        spec = msgspec.structs.replace(command.spec, input=plain)
        command = msgspec.structs.replace(command, spec=spec)
    return command


def encode_json(value: Any) -> bytes:
    """Encode a Struct (or plain data) as JSON."""
    return msgspec.json.encode(value)


def spawn_batch(specs: Iterable[Any]) -> tuple[SpawnSpec, ...]:
    """The specs of a batched spawn, each checked and converted as
    ``make_spec`` does (a ``SpawnSpec`` built by hand may hold a field of the
    wrong type, e.g. ``kind="worker"``, which becomes the enum);
    ``RejectedInputError`` naming ``specs[i]`` (and the field) for an item
    that is not a valid ``SpawnSpec``."""
    batch = []
    # One spec repeated stays one object (its children share one TTL timer). The
    # original is kept with its check, so its id is not reused while this runs.
    checked: dict[int, tuple[SpawnSpec, SpawnSpec]] = {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, SpawnSpec):
            msg = f"specs[{i}] is a {type(spec).__name__}, not a SpawnSpec"
            raise RejectedInputError(msg, field=f"specs[{i}]")
        seen = checked.get(id(spec))
        if seen is None:
            try:
                seen = checked[id(spec)] = (spec, make_spec(spec))
            except RejectedInputError as exc:
                msg = f"specs[{i}]: {exc}"
                field = f"specs[{i}]" if exc.field is None else f"specs[{i}].{exc.field}"
                raise RejectedInputError(msg, field=field) from exc
        batch.append(seen[1])
    return tuple(batch)


def _builtins_of(spec: Any) -> Any:
    """A spec (or its fields) as plain data; ``RejectedInputError`` naming the field
    that holds a value with no plain form (an ``object()`` in ``metadata``)."""
    try:
        return msgspec.to_builtins(spec)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        field = None
        values = spec if isinstance(spec, dict) else msgspec.structs.asdict(spec)
        for name, value in values.items():
            try:
                msgspec.to_builtins(value)
            except (TypeError, ValueError, OverflowError, RecursionError):
                field = name
                break
        msg = f"invalid spawn spec: {exc}" + (f" - at `$.{field}`" if field else "")
        raise RejectedInputError(msg, field=field) from exc


def make_spec(spec: Any = None, /, **fields: Any) -> SpawnSpec:
    """A validated ``SpawnSpec`` from a spec or its fields as keywords.

    Types are checked strictly (``ttl="5"`` is refused, ``kind="branch"`` is
    accepted as the enum); raises ``RejectedInputError`` naming the field, or
    ``TypeError`` when both a spec and keywords are given.
    """
    if spec is not None and fields:
        msg = "pass either a SpawnSpec or keyword fields, not both"
        raise TypeError(msg)
    # As plain data first (a Budget becomes a mapping and is checked like one; a
    # value in metadata with no plain form is refused here, not by the store).
    raw = _builtins_of(spec if spec is not None else fields)
    try:
        made = msgspec.convert(raw, SpawnSpec)
    except msgspec.ValidationError as exc:
        raise RejectedInputError(f"invalid spawn spec: {exc}", field=_field_of(exc)) from exc
    if made.input is not None:
        made = msgspec.structs.replace(made, input=plain_input(made.input))
    return made


def plain_input(value: Any) -> Any:
    """A spawn's ``input`` as its session reads it: a detached copy as JSON data.

    Raises ``RejectedInputError`` naming ``input`` for a value msgspec cannot
    encode as JSON, one over ``MAX_INPUT_BYTES`` encoded (``too_large``) or
    nested deeper than ``MAX_INPUT_NESTING`` (``too_deep``), an integer
    beyond 64 bits (the store could not write it), or a NaN or infinity
    anywhere in it (JSON has none; the field names its path, as
    ``input.rows[2]``), which would otherwise arrive as None."""
    try:
        encoded = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        msg = f"input is not encodable as JSON: {exc}"
        raise RejectedInputError(msg, field="input") from exc
    if len(encoded) > MAX_INPUT_BYTES:
        msg = f"input of {len(encoded)} bytes encoded is over the cap of {MAX_INPUT_BYTES}"
        raise RejectedInputError(msg, field="input", reason="too_large")
    # Counting brackets is C-fast and bounds the depth from above; the exact
    # (Python) scan runs only for inputs with many brackets.
    brackets = encoded.count(b"[") + encoded.count(b"{")
    if brackets > MAX_INPUT_NESTING and _nesting(encoded) > MAX_INPUT_NESTING:
        msg = f"input is nested deeper than {MAX_INPUT_NESTING} levels"
        raise RejectedInputError(msg, field="input", reason="too_deep")
    if b"null" in encoded:  # JSON has no NaN or infinity: msgspec writes them as null
        where = _non_finite(msgspec.to_builtins(value), "input")
        if where is not None:
            path, number = where
            raise _refuse_non_finite(path, number)
    plain = msgspec.json.decode(encoded)
    try:
        msgspec.msgpack.encode(plain)
    except OverflowError as exc:
        msg = f"input holds an integer the store cannot write: {exc}"
        raise RejectedInputError(msg, field="input") from exc
    return plain
