"""Chat commands on a conversation: ``/fork``, ``/branches``, ``/checkout``,
``/tree``, ``/merge``, ``/delete-branch``, ``/confirm-delete-branch``, ``/help``.

``chat_command`` answers every text that starts with ``/`` with a
``ChatReply``: ``text`` for the chat, ``data`` for programs. An unknown
command, a missing or bad argument, a message or branch that does not
exist, even a failed store write, is a reply with ``ok`` False and an
``ErrorInfo`` — never an exception.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from sessiontree.conversations import EXPORT_FORMATS, Conversation, preview_text
from sessiontree.protocol import (
    BranchInfo,
    ChatReply,
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionInfo,
    SessionTreeError,
)

__all__ = ["COMMANDS", "Sessions", "chat_command", "is_command"]

#: How a chat finds the session a sub-agent's branch belongs to (None: unknown).
Sessions = Callable[[uuid.UUID], SessionInfo | None]

#: Each command with its usage line.
COMMANDS = {
    "fork": "/fork [name] — as a reply to a message: a new branch from that message",
    "branches": "/branches — every branch, numbered",
    "checkout": "/checkout N — switch to branch N (a number or a name)",
    "tree": "/tree json|html|text — export the conversation tree",
    "merge": "/merge N — copy branch N's messages onto the current branch",
    "delete-branch": "/delete-branch N — ask to delete branch N",
    "confirm-delete-branch": "/confirm-delete-branch N — delete branch N after /delete-branch N",
    "help": "/help — this list",
}
_COMMAND = re.compile(r"/([A-Za-z][A-Za-z0-9_-]*)(?:@\S+)?(?:\s+(.*))?", re.S)


def is_command(text: str) -> bool:
    """Whether ``text`` is a chat command (``/word…``), known or not."""
    return _COMMAND.fullmatch(text.strip()) is not None


def chat_command(
    conversation: Conversation,
    text: str,
    *,
    reply_to: str | None = None,
    sessions: Sessions | None = None,
) -> ChatReply:
    """Run one chat command on ``conversation`` and return the reply.

    ``reply_to`` is the chat platform's id of the message this command
    replies to (``/fork`` needs it). ``sessions`` finds the session a
    sub-agent's branch belongs to (``/branches`` and ``/checkout`` show its
    kind, skill and state). Text that is not a command gets an
    ``unknown_command`` reply.
    """
    match = _COMMAND.fullmatch(text.strip())
    if match is None:
        return _failed("", ErrorCode.UNKNOWN_COMMAND, "that is not a command; try /help")
    name = match.group(1).lower()
    argument = (match.group(2) or "").strip()
    handler = _HANDLERS.get(name)
    if handler is None:
        return _failed(name, ErrorCode.UNKNOWN_COMMAND, f"unknown command /{name}\n\n{_usage()}")
    try:
        return handler(conversation, argument, _Asked(reply_to, sessions or _nobody))
    except SessionTreeError as exc:  # unknown message or branch, bad name, store failure
        info = exc.to_info()
        return ChatReply(command=name, ok=False, text=f"⚠️ {_plain(exc)}", error=info)


def _fork(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    reply_to = asked.reply_to
    if reply_to is None:
        return _failed(
            "fork",
            ErrorCode.REJECTED_INPUT,
            "reply to the message you want to branch from, then type /fork [name]",
        )
    message = conversation.by_platform_id(reply_to)
    if message is None:
        return _failed(
            "fork",
            ErrorCode.UNKNOWN_MESSAGE,
            "I don't know the message you replied to (it was never stored in this "
            "conversation); reply to another one",
        )
    branch = conversation.fork(message.id, argument or None)
    text = (
        f"🌿 New branch created: {branch.name}\n"
        f'Now working from: "{preview_text(message.content)}"\n'
        "Previous messages are preserved."
    )
    return _ok("fork", text, branch=_branch_data(branch), from_message_id=str(message.id))


def _branches(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    if argument:
        return _usage_error("branches")
    branches = conversation.branches()
    lines = ["🌳 Branches:", ""]
    for branch in branches:
        last = branch.last_message
        lines.append(f"{branch.number}. {branch.name}{' (current)' if branch.current else ''}")
        agent = _sub_agent(branch, asked.sessions)
        if agent:
            lines.append(f"   🤖 {agent}")
        lines.append(
            f'   Last message: "{preview_text(last.content, 60)}"' if last else "   (empty)"
        )
        lines.append(f"   {branch.message_count} messages, {_age(branch.age_s)}")
    lines += ["", "💡 Use /checkout <number> to switch branches"]
    data = [_branch_data(b, asked.sessions) for b in branches]
    return _ok("branches", "\n".join(lines), branches=data)


def _checkout(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    if not argument:
        return _usage_error("checkout")
    branch = conversation.checkout(argument)
    text = (
        f"🌿 Switched to branch: {branch.name}\n"
        "Context loaded from this branch. Work on the other branches is preserved."
    )
    agent = _sub_agent(branch, asked.sessions)
    if agent:
        text += (
            f"\n🤖 This is the context of a sub-agent ({agent}); a message here "
            "continues its work in a fresh session."
        )
    return _ok("checkout", text, branch=_branch_data(branch, asked.sessions))


def _tree(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    del asked
    fmt = argument.lower() or "text"
    if fmt not in EXPORT_FORMATS:
        return _usage_error("tree")
    content = conversation.export_tree(fmt)
    text = content if fmt == "text" else f"🌳 Conversation tree exported as {fmt}."
    return _ok("tree", text, format=fmt, content=content)


def _merge(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    del asked
    if not argument:
        return _usage_error("merge")
    merged = conversation.merge(argument)
    lines = [f"🌿 Merged branch: {merged.source_name}", ""]
    if merged.messages:
        lines.append("Messages merged:")
        lines += [f'- "{preview_text(m.content, 60)}" ✓' for m in merged.messages]
    else:
        lines.append("It has no messages of its own: nothing to merge.")
    lines += ["", f"Current branch: {merged.into_name} (updated)"]
    return _ok(
        "merge",
        "\n".join(lines),
        source=merged.source_number,
        into=merged.into_number,
        message_ids=[str(m.id) for m in merged.messages],
    )


def _delete_branch(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    del asked
    if not argument:
        return _usage_error("delete-branch")
    plan = conversation.delete_branch(argument)
    conversation.remember_delete(plan)
    kept = f" ({plan.kept} stay: other branches grow from them)" if plan.kept else ""
    text = (
        f'⚠️ Are you sure you want to delete branch "{plan.name}"?\n'
        f"This will delete {plan.count} messages{kept} and cannot be undone.\n\n"
        f"Type /confirm-delete-branch {plan.number} to proceed."
    )
    return _ok("delete-branch", text, plan=msgspec.to_builtins(plan))


def _confirm_delete(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    del asked
    if not re.fullmatch(r"[0-9]{1,9}", argument):
        return _usage_error("confirm-delete-branch")
    number = int(argument)
    token = conversation.pending_delete(number)
    if token is None:
        return _failed(
            "confirm-delete-branch",
            ErrorCode.CONFIRMATION_MISMATCH,
            f"nothing to confirm: ask first with /delete-branch {number}",
        )
    plan = conversation.confirm_delete(token)
    text = f'🗑️ Branch "{plan.name}" deleted: {plan.count} messages removed from history.'
    return _ok("confirm-delete-branch", text, plan=msgspec.to_builtins(plan))


def _help(conversation: Conversation, argument: str, asked: _Asked) -> ChatReply:
    del conversation, argument, asked
    return _ok("help", _usage(), commands=sorted(COMMANDS))


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a command was asked with besides its argument."""

    reply_to: str | None  # the chat platform's id of the message it replies to
    sessions: Sessions


_HANDLERS: dict[str, Callable[[Conversation, str, _Asked], ChatReply]] = {
    "fork": _fork,
    "branches": _branches,
    "checkout": _checkout,
    "tree": _tree,
    "merge": _merge,
    "delete-branch": _delete_branch,
    "confirm-delete-branch": _confirm_delete,
    "help": _help,
}


def _ok(command: str, text: str, **data: Any) -> ChatReply:
    return ChatReply(command=command, ok=True, text=text, data=data)


def _failed(command: str, code: ErrorCode, text: str) -> ChatReply:
    return ChatReply(
        command=command,
        ok=False,
        text=f"⚠️ {text}",
        error=ErrorInfo(code=code, message=text),
    )


def _usage_error(command: str) -> ChatReply:
    error = RejectedInputError(f"usage: {COMMANDS[command]}", field="argument")
    return ChatReply(command=command, ok=False, text=f"⚠️ {error}", error=error.to_info())


def _usage() -> str:
    return "Commands:\n" + "\n".join(COMMANDS.values())


def _plain(exc: SessionTreeError) -> str:
    """The error's sentence without the session id prefix (the chat knows its session)."""
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("session ") and ": " in text else text


def _branch_data(branch: BranchInfo, sessions: Sessions | None = None) -> dict[str, Any]:
    """A branch as a command's data; a sub-agent's with its ``session``
    (kind, skill, state) when ``sessions`` knows it."""
    data: dict[str, Any] = msgspec.to_builtins(branch)
    info = None if branch.session_id is None or sessions is None else sessions(branch.session_id)
    if info is not None:
        data["session"] = {"kind": info.kind.value, "skill": info.skill, "state": info.state.value}
    return data


def _sub_agent(branch: BranchInfo, sessions: Sessions) -> str:
    """How a chat names the sub-agent whose context ``branch`` is ('' for none)."""
    if branch.session_id is None:
        return ""
    info = sessions(branch.session_id)
    if info is None:
        return f"sub-agent {branch.session_id}"
    return f"{info.kind.value} {info.skill}, {info.state.value}"


def _nobody(session_id: uuid.UUID) -> SessionInfo | None:
    """``Sessions`` when the chat has no node to ask."""
    del session_id
    return None


def _age(seconds: float) -> str:
    if seconds < 60:
        return "changed just now"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"changed {count} {unit}{'s' if count != 1 else ''} ago"
    return "changed just now"
