"""A conversation as data and documents: the nested tree, its renderings, the transcript."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from sessiontree.conversations._html import render_html
from sessiontree.conversations._text import nested_json, text_tree
from sessiontree.protocol import BranchInfo, Message, RejectedInputError

__all__ = ["EXPORT_FORMATS", "check_format", "nested_tree", "render", "transcript_lines"]

EXPORT_FORMATS = ("json", "text", "html")


def nested_tree(
    session_id: uuid.UUID,
    current_branch: str,
    tip: uuid.UUID | None,
    branches: Iterable[BranchInfo],
    messages: Iterable[Message],
) -> dict[str, Any]:
    """The whole tree, nested, in the specification's keys (``parentId``…)."""
    nodes = sorted(messages, key=lambda m: m.seq)
    children: dict[uuid.UUID | None, list[dict[str, Any]]] = {}
    for message in nodes:
        node = message.to_spec()
        node["children"] = children.setdefault(message.id, [])
        children.setdefault(message.parent_id, []).append(node)
    ids = {m.id for m in nodes}
    roots = children.get(None, [])
    for parent, orphans in children.items():  # a parent deleted from under them
        if parent is not None and parent not in ids:
            roots.extend(orphans)
    return {
        "sessionId": str(session_id),
        "activeLeafId": None if tip is None else str(tip),
        "currentBranchId": current_branch,
        "branches": [_branch_spec(b) for b in branches],
        "root": {"id": "root", "children": roots},
    }


def check_format(fmt: str) -> None:
    """``RejectedInputError`` unless ``fmt`` is one of ``EXPORT_FORMATS``."""
    if fmt not in EXPORT_FORMATS:
        msg = f"format {fmt!r} must be one of {', '.join(EXPORT_FORMATS)}"
        raise RejectedInputError(msg, field="format")


def render(tree: dict[str, Any], fmt: str) -> str:
    """``tree`` as ``json`` (nested), ``text`` (an ASCII tree) or ``html`` (one page)."""
    if fmt == "json":
        return nested_json(tree)
    if fmt == "text":
        return text_tree(tree)
    return render_html(tree, title=f"Conversation {tree['sessionId']}")


def transcript_lines(messages: Iterable[Message]) -> Iterator[str]:
    """JSONL lines, one message a line, in the order written, specification keys."""
    for message in sorted(messages, key=lambda m: m.seq):
        yield json.dumps(message.to_spec(), ensure_ascii=False) + "\n"


def _branch_spec(info: BranchInfo) -> dict[str, Any]:
    return {
        "number": info.number,
        "id": info.id,
        "name": info.name,
        "baseId": None if info.base_id is None else str(info.base_id),
        "leafId": None if info.leaf_id is None else str(info.leaf_id),
        "messageCount": info.message_count,
        "ownMessages": info.own_messages,
        "current": info.current,
    } | ({} if info.session_id is None else {"sessionId": str(info.session_id)})
