"""Control commands: the one tagged union that outside callers send a node."""

from __future__ import annotations

import uuid
from typing import Any, TypeAlias

import msgspec

from sessiontree.protocol._specs import SpawnSpec

__all__ = ["CancelCmd", "ControlMessage", "ResumeCmd", "SendCmd", "SpawnCmd", "SuspendCmd"]


class _Command(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"
):
    pass


class SpawnCmd(_Command, frozen=True, tag="spawn"):
    """Spawn a child under ``parent_id``."""

    parent_id: uuid.UUID
    spec: SpawnSpec


class SendCmd(_Command, frozen=True, tag="send"):
    """Send an inbound message to a Main session (it starts one message cycle)."""

    session_id: uuid.UUID
    message: Any


class CancelCmd(_Command, frozen=True, tag="cancel"):
    """Cancel a session and its whole subtree (one deadline for all)."""

    session_id: uuid.UUID


class SuspendCmd(_Command, frozen=True, tag="suspend"):
    """Suspend a Branch at its next checkpoint."""

    session_id: uuid.UUID


class ResumeCmd(_Command, frozen=True, tag="resume"):
    """Resume a suspended Branch."""

    session_id: uuid.UUID


ControlMessage: TypeAlias = SpawnCmd | SendCmd | CancelCmd | SuspendCmd | ResumeCmd
