"""Identifiers: session ids and per-sender session keys."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import uuid
from typing import TypeAlias

import msgspec

from sessiontree.protocol._errors import RejectedInputError

__all__ = ["SCOPES", "SLOTS", "SessionId", "SessionKey", "new_session_id", "slot_for", "slot_of"]

SessionId: TypeAlias = uuid.UUID

_PROVIDER = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_IDENTIFIER = re.compile(r"[A-Za-z0-9._+@/-]{1,256}")
_IDENTIFIER_CHARS = re.compile(r"[A-Za-z0-9._+@/-]")

#: The scopes a session key may have.
SCOPES = ("main", "dm", "group", "channel", "thread")


_RANDOM_IDS = 256  # ids drawn from one read of the OS's random source
_random = b""
_random_at = 0
_random_lock = threading.Lock()


#: The fixed number of slots a node's trees are spread over (a cluster moves
#: trees between nodes a slot at a time).
SLOTS = 16_384
_SLOT_SHIFT = 128 - 14  # a slot sits in an id's top 14 bits
_SLOTTED_VERSION = 8  # RFC 9562's version for custom layouts marks a slotted id
# The version nibble (bits 76-79) and the RFC 4122 variant (bits 62-63) are
# set by hand: ``uuid.UUID(version=8)`` is refused before Python 3.12.
_VERSION_8 = (_SLOTTED_VERSION << 76) | (0b10 << 62)
_FREE_BITS = ((1 << _SLOT_SHIFT) - 1) & ~((0xF << 76) | (0b11 << 62))


def new_session_id(slot: int | None = None) -> SessionId:
    """A fresh random session id, from the OS's random source.

    With ``slot`` (``0 <= slot < SLOTS``) the id is *slotted*: a version 8
    UUID whose top 14 bits are the slot and whose other 108 free bits are
    random, so one slot is one contiguous key range in every database that
    starts its keys with the id. Without it, a random version 4 id
    (*unslotted*, as every id was before slots). A slot out of range raises
    ``ValueError``.

    ``uuid.uuid4`` reads the random source once per id; here one read serves
    256 ids (a read cost ~35 us on the machines we measured, most of a spawn).
    """
    global _random, _random_at  # noqa: PLW0603 - the one buffer of the process
    with _random_lock:
        if _random_at >= len(_random):
            _random, _random_at = os.urandom(16 * _RANDOM_IDS), 0
        chunk = _random[_random_at : _random_at + 16]
        _random_at += 16
    if slot is None:
        return uuid.UUID(bytes=chunk, version=4)
    if not 0 <= slot < SLOTS:
        msg = f"slot {slot} is outside 0..{SLOTS - 1}"
        raise ValueError(msg)
    bits = int.from_bytes(chunk, "big") & _FREE_BITS
    return uuid.UUID(int=(slot << _SLOT_SHIFT) | _VERSION_8 | bits)


def slot_of(session_id: SessionId) -> int | None:
    """The slot a slotted id carries; ``None`` for an unslotted (version 4) id."""
    if session_id.version != _SLOTTED_VERSION:
        return None
    return session_id.int >> _SLOT_SHIFT


def slot_for(agent_id: str, key: str) -> int:
    """The slot of the Main of ``(agent_id, key)``: a stable hash (the same in
    every process and every release), so any router finds a key's slot."""
    digest = hashlib.blake2b(f"{agent_id}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SLOTS


class SessionKey(msgspec.Struct, frozen=True):
    """``{provider}:{scope}:{identifier}``, e.g. ``telegram:dm:42``,
    ``discord:channel:987654``, ``internal:main:main``, ``telegram:dm:bot7/42``.

    ``provider``: ``[a-z][a-z0-9_-]{0,31}``; ``scope``: one of ``SCOPES``;
    ``identifier``: 1-256 characters of ``[A-Za-z0-9._+@/-]`` (an account and a
    peer are joined by ``/``). A bad part raises ``RejectedInputError`` whose
    ``field`` names it and whose message says why.
    """

    provider: str
    scope: str
    identifier: str

    def __post_init__(self) -> None:
        for name in ("provider", "scope", "identifier"):
            value = getattr(self, name)
            if not isinstance(value, str):
                msg = f"session key {name} must be a string, not {type(value).__name__}"
                raise RejectedInputError(msg, field=name)
        if not _PROVIDER.fullmatch(self.provider):
            msg = (
                f"session key provider {self.provider!r} must be a lower-case letter followed "
                "by at most 31 of a-z, 0-9, _ and -"
            )
            raise RejectedInputError(msg, field="provider")
        if self.scope not in SCOPES:
            msg = f"session key scope {self.scope!r} must be one of {', '.join(SCOPES)}"
            raise RejectedInputError(msg, field="scope")
        if not _IDENTIFIER.fullmatch(self.identifier):
            if not self.identifier:
                why = "is empty"
            elif len(self.identifier) > 256:
                why = f"has {len(self.identifier)} characters (at most 256)"
            else:
                bad = sorted({c for c in self.identifier if not _IDENTIFIER_CHARS.fullmatch(c)})
                why = f"has characters outside A-Z a-z 0-9 . _ + @ / -: {''.join(bad)!r}"
            msg = f"session key identifier {self.identifier[:64]!r} {why}"
            raise RejectedInputError(msg, field="identifier")

    @classmethod
    def parse(cls, text: str) -> SessionKey:
        """Parse ``provider:scope:identifier``; ``RejectedInputError`` naming the bad part."""
        if not isinstance(text, str):
            msg = f"session key must be a string, not {type(text).__name__}"
            raise RejectedInputError(msg, field="key")
        parts = text.split(":", 2)
        if len(parts) != 3:
            msg = f"session key {text[:64]!r} is not provider:scope:identifier"
            raise RejectedInputError(msg, field="key")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.provider}:{self.scope}:{self.identifier}"
