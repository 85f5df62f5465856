"""Inbound chat messages, how they map to session keys, and chat replies.

``Inbound`` is what a chat gateway hands the node; ``session_key_for``
turns it into the per-sender ``SessionKey``: direct messages by the agent's
``dm_scope``, groups, channels and threads always by their own chat id (the
README's "Conversations and per-sender sessions").
"""

from __future__ import annotations

import enum
import uuid
from typing import Annotated, Any

import msgspec

from sessiontree.protocol._codec import _field_of, decode_strict
from sessiontree.protocol._errors import ErrorInfo, RejectedInputError
from sessiontree.protocol._ids import SessionKey

__all__ = [
    "MAIN_KEY",
    "MAX_TEXT_CHARS",
    "ChatMessage",
    "ChatReply",
    "ChatType",
    "DmScope",
    "Inbound",
    "Routed",
    "decode_inbound",
    "session_key_for",
]

MAX_TEXT_CHARS = 100_000
MAIN_KEY = "internal:main:main"
"""The key of an agent's main session (where ``dm_scope="main"`` sends every DM)."""

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class ChatType(enum.StrEnum):
    """The kind of chat a message came from."""

    DM = "dm"
    GROUP = "group"
    CHANNEL = "channel"
    THREAD = "thread"


class DmScope(enum.StrEnum):
    """How direct messages map to sessions (per agent)."""

    MAIN = "main"  # every DM shares the agent's main session
    PER_CHANNEL_PEER = "per-channel-peer"  # one session per sender per provider
    PER_ACCOUNT_CHANNEL_PEER = "per-account-channel-peer"  # and per bot account


class Inbound(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message from a chat platform.

    ``message_id`` is the platform's id of this message (kept so a later
    ``/fork`` sent as a reply can find it); ``reply_to`` the platform id of
    the message this one replies to; ``account`` the bot account that
    received it (used by ``per-account-channel-peer``).
    """

    provider: Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
    chat_type: ChatType
    chat_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._+@-]{1,256}$")]
    sender_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._+@-]{1,191}$")]
    text: Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
    # account "/" sender_id is one key identifier: 64 + 1 + 191 = its 256 at most
    account: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._+@-]{0,64}$")] = ""
    message_id: _Id | None = None
    reply_to: _Id | None = None


_INBOUND_JSON = msgspec.json.Decoder(Inbound)
MAX_INBOUND_BYTES = 4 * MAX_TEXT_CHARS + 8192  # the text in UTF-8 at worst, and the rest


def decode_inbound(data: object) -> Inbound:
    """An ``Inbound`` from JSON bytes, a mapping or an ``Inbound``.

    Bytes are size-checked before decoding; nothing is coerced. Raises
    ``RejectedInputError`` naming the field for anything else.
    """
    if isinstance(data, Inbound):
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        return decode_strict(bytes(data), _INBOUND_JSON, max_bytes=MAX_INBOUND_BYTES)
    if isinstance(data, dict):
        try:
            return msgspec.convert(data, Inbound)
        except msgspec.ValidationError as exc:
            field = _field_of(exc)
            raise RejectedInputError(f"invalid inbound message: {exc}", field=field) from None
    kind = type(data).__name__
    msg = f"an inbound message must be an Inbound, a mapping or JSON bytes, not {kind}"
    raise RejectedInputError(msg, field="inbound")


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, tag="chat"):
    """What a Main's skill receives for a routed message (``session.message``).

    ``message_id`` is the conversation message the text was appended as.
    A Main receives it as a plain mapping (the same before and after a
    restart); ``ChatMessage.of(session.message)`` gives the typed view.
    """

    key: str
    message_id: uuid.UUID
    inbound: Inbound

    def to_message(self) -> dict[str, Any]:
        """The mapping a Main receives."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    @classmethod
    def of(cls, message: object) -> ChatMessage | None:
        """The typed view of a Main's ``session.message``, or None if it is not a chat message."""
        if isinstance(message, ChatMessage):
            return message
        if not isinstance(message, dict) or message.get("type") != "chat":
            return None
        try:
            return msgspec.convert(message, cls)
        except msgspec.ValidationError:
            return None


class ChatReply(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a chat command: ``text`` for the chat, ``data`` for programs.

    ``ok`` False with ``error`` for an unknown command or a bad argument.
    """

    command: str
    ok: bool
    text: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    error: ErrorInfo | None = None


class Routed(msgspec.Struct, frozen=True, kw_only=True):
    """Where ``route`` put an inbound message.

    ``message_id``: the conversation message it became (None for a chat
    command, which is answered in ``reply`` and not handed to the session).
    ``duplicate``: a platform message id seen before (a gateway's retry): the
    message was neither appended nor handed over again. ``error``: the
    message is stored but the session could not take it (e.g. node closing).
    ``continued``: the current branch was a sub-agent's context, so the
    message went there and this fresh session continues that sub-agent's
    work (forked at the message, seeing the sub-agent's branch); the Main
    was not handed the message.
    """

    agent_id: str
    key: str
    session_id: uuid.UUID
    message_id: uuid.UUID | None = None
    reply: ChatReply | None = None
    duplicate: bool = False
    error: ErrorInfo | None = None
    continued: uuid.UUID | None = None


def session_key_for(inbound: Inbound, dm_scope: DmScope | str) -> SessionKey:
    """The session key of ``inbound`` under ``dm_scope``.

    ``RejectedInputError`` names the field of ``inbound`` (or ``dm_scope``)
    that cannot make a key, and why.
    """
    try:
        scope = DmScope(dm_scope)
    except ValueError:
        choices = ", ".join(s.value for s in DmScope)
        msg = f"dm_scope {dm_scope!r} must be one of {choices}"
        raise RejectedInputError(msg, field="dm_scope") from None
    try:
        chat_type = ChatType(inbound.chat_type)
    except ValueError:
        choices = ", ".join(c.value for c in ChatType)
        msg = f"chat_type {inbound.chat_type!r} must be one of {choices}"
        raise RejectedInputError(msg, field="chat_type") from None
    if chat_type is ChatType.DM:
        if scope is DmScope.MAIN:
            return SessionKey.parse(MAIN_KEY)
        parts = [("sender_id", inbound.sender_id)]
        if scope is DmScope.PER_ACCOUNT_CHANNEL_PEER:
            if not inbound.account:
                msg = "account is required when dm_scope is per-account-channel-peer"
                raise RejectedInputError(msg, field="account")
            parts.insert(0, ("account", inbound.account))
    else:
        parts = [("chat_id", inbound.chat_id)]
    for name, value in parts:
        if "/" in value:
            msg = f"{name} {value[:64]!r} may not contain '/' (it joins account and peer)"
            raise RejectedInputError(msg, field=name)
    identifier = "/".join(value for _, value in parts)
    try:
        SessionKey(inbound.provider, "main", "main")
    except RejectedInputError as exc:
        raise RejectedInputError(str(exc), field="provider") from None
    try:
        return SessionKey(inbound.provider, chat_type.value, identifier)
    except RejectedInputError as exc:
        field = parts[0][0] if len(parts) == 1 else "sender_id"
        for name, value in parts:
            try:
                SessionKey(inbound.provider, chat_type.value, value)
            except RejectedInputError:
                field = name
                break
        raise RejectedInputError(f"{field}: {exc}", field=field) from None
