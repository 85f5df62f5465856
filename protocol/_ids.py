"""Identifiers: session ids and per-sender session keys."""

from __future__ import annotations

import re
import uuid
from typing import TypeAlias

import msgspec

from sessiontree.protocol._errors import RejectedInputError

__all__ = ["SessionId", "SessionKey", "new_session_id"]

SessionId: TypeAlias = uuid.UUID

_PART = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_IDENTIFIER = re.compile(r"[^\s]{1,256}")


def new_session_id() -> SessionId:
    """A fresh random session id."""
    return uuid.uuid4()


class SessionKey(msgspec.Struct, frozen=True):
    """``{provider}:{scope}:{identifier}``, e.g. ``telegram:dm:42``.

    ``provider`` and ``scope`` are lower-case words; ``identifier`` is up to 256
    characters without whitespace and may itself contain colons.
    """

    provider: str
    scope: str
    identifier: str

    def __post_init__(self) -> None:
        for name in ("provider", "scope"):
            value = getattr(self, name)
            if not _PART.fullmatch(value):
                msg = f"session key {name} {value!r} must match {_PART.pattern}"
                raise RejectedInputError(msg, field=name)
        if not _IDENTIFIER.fullmatch(self.identifier):
            msg = f"session key identifier {self.identifier!r} must be 1-256 non-space characters"
            raise RejectedInputError(msg, field="identifier")

    @classmethod
    def parse(cls, text: str) -> SessionKey:
        """Parse ``provider:scope:identifier``; raises ``RejectedInputError`` naming the part."""
        if not isinstance(text, str):
            msg = f"session key must be a string, not {type(text).__name__}"
            raise RejectedInputError(msg, field="key")
        parts = text.split(":", 2)
        if len(parts) != 3:
            msg = f"session key {text!r} is not provider:scope:identifier"
            raise RejectedInputError(msg, field="key")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.provider}:{self.scope}:{self.identifier}"
