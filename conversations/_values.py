"""The values a conversation makes and accepts: ids, roles, names, references."""

from __future__ import annotations

import os
import random
import re
import uuid
from typing import Any

from sessiontree.protocol import (
    MAX_BRANCH_NAME_CHARS,
    Message,
    RejectedInputError,
    Role,
    check_text,
)

__all__ = [
    "BranchRef",
    "as_uuid",
    "check_branch_name",
    "check_platform_id",
    "draft",
    "maybe_uuid",
    "new_branch_id",
    "new_id",
    "placed_id",
    "role_of",
]

BranchRef = int | str | uuid.UUID

_NAME = re.compile(r"[^\x00-\x1f\x7f]+")
_ROLES = tuple(r.value for r in Role)

# Message ids are names, not secrets: a generator seeded from the OS, so an id
# costs no system call (uuid4 makes one per id, ~9 % of an append's time).
_RANDOM = random.Random(os.urandom(32))  # noqa: S311


def new_id() -> uuid.UUID:
    """A new message id."""
    return uuid.UUID(int=_RANDOM.getrandbits(128), version=4)


_UNPLACED = uuid.UUID(int=0)


def placed_id(message: Message) -> uuid.UUID:
    """The id a draft takes when it is placed: the one it was given (a keyed
    append's), else a new one."""
    return new_id() if message.id == _UNPLACED else message.id


def draft(role: Role, content: Any, **fields: Any) -> Message:
    """A message not yet placed on a branch: its id, parent, place, branch and
    time are given when it is (``_branching.chain`` or ``placed``)."""
    return Message(
        id=_UNPLACED,
        parent_id=None,
        role=role,
        content=content,
        timestamp=0.0,
        branch_id="",
        **fields,
    )


def new_branch_id() -> str:
    """A new branch id (``branch_`` and 8 hex digits)."""
    return f"branch_{uuid.uuid4().hex[:8]}"


def role_of(role: object) -> Role:
    """``role`` as a ``Role``, or ``RejectedInputError`` naming ``role``."""
    if isinstance(role, str) and role in _ROLES:
        return Role(role)
    choices = ", ".join(_ROLES)
    msg = f"role {role!r} must be one of {choices}"
    raise RejectedInputError(msg, field="role")


def check_branch_name(name: object) -> str:
    """``name`` if it can name a branch: 1-64 characters without control
    characters, neither a number nor an id; else ``RejectedInputError``."""
    if (
        not isinstance(name, str)
        or not 1 <= len(name) <= MAX_BRANCH_NAME_CHARS
        or not _NAME.fullmatch(name)
        or not name.strip()
    ):
        msg = (
            f"branch name must be 1-{MAX_BRANCH_NAME_CHARS} characters without control "
            f"characters, got {name!r}"
        )
        raise RejectedInputError(msg, field="name")
    check_text(name, "name")
    if (
        re.fullmatch(r"[0-9]+", name.strip())
        or maybe_uuid(name) is not None
        or name.startswith("branch_")
    ):
        msg = f"branch name {name!r} would read as a number or an id; choose a word"
        raise RejectedInputError(msg, field="name")
    return name


def check_platform_id(platform_id: object) -> None:
    """``RejectedInputError`` unless ``platform_id`` is a string of 1-256 characters."""
    if not isinstance(platform_id, str) or not 1 <= len(platform_id) <= 256:
        msg = f"platform_id must be a string of 1-256 characters, got {platform_id!r}"
        raise RejectedInputError(msg, field="platform_id")
    check_text(platform_id, "platform_id")


def maybe_uuid(value: object) -> uuid.UUID | None:
    """``value`` as a UUID if it is one or spells one (32 or 36 characters), else None."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str) and len(value) in (32, 36):
        try:
            return uuid.UUID(value)
        except ValueError:
            return None
    return None


def as_uuid(value: object, field: str) -> uuid.UUID:
    """``value`` as a message id, or ``RejectedInputError`` naming ``field``.

    Any spelling ``uuid.UUID`` parses is taken (a message id is the tree's own);
    a session id from a user must be canonical (``supervision``'s ``as_session_id``).
    """
    found = maybe_uuid(value)
    if found is None:
        msg = f"{field} must be a message id (a UUID), got {value!r}"
        raise RejectedInputError(msg, field=field)
    return found
