"""Plain renderings of a conversation tree: nested JSON and an ASCII tree.

Both walk the tree without recursion: a conversation can be 100,000
messages deep, far past Python's recursion limit (and ``json.dumps``'s).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec

__all__ = ["nested_json", "preview_text", "text_tree"]

_PREVIEW_CHARS = 80
_ENCODER = msgspec.json.Encoder()


def preview_text(content: Any, chars: int = _PREVIEW_CHARS) -> str:
    """``content`` on one line, at most ``chars`` characters (JSON for a non-string)."""
    text = content if isinstance(content, str) else _ENCODER.encode(content).decode()
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def nested_json(tree: dict[str, Any]) -> str:
    """``tree`` as JSON without recursion (a conversation can be 100,000 messages
    deep, far past the recursion limit of ``json.dumps``)."""
    out = io.StringIO()
    head = {k: v for k, v in tree.items() if k != "root"}
    out.write(_ENCODER.encode(head).decode()[:-1])
    out.write(',"root":{"id":"root","children":[')
    stack: list[Iterator[dict[str, Any]]] = [iter(tree["root"]["children"])]
    first = [True]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            first.pop()
            out.write("]}" if stack else "]}}")
            continue
        if not first[-1]:
            out.write(",")
        first[-1] = False
        fields = {k: v for k, v in node.items() if k != "children"}
        out.write(_ENCODER.encode(fields).decode()[:-1])
        out.write(',"children":[')
        stack.append(iter(node["children"]))
        first.append(True)
    return out.getvalue()


def _branches(count: int) -> str:
    return f"{count} branch" if count == 1 else f"{count} branches"


def text_tree(tree: dict[str, Any]) -> str:
    """An ASCII tree: a chain stays in one column; a fork indents its branches."""
    names = {b["id"]: f"{b['number']} {b['name']}" for b in tree["branches"]}
    current = tree["currentBranchId"]
    leaf = tree["activeLeafId"]
    lines = [
        f"conversation {tree['sessionId']}: {_branches(len(tree['branches']))}, "
        f"current {names.get(current, current)}"
    ]
    # (node, prefix for its own line, prefix for what follows it, branch shown above)
    stack: list[tuple[dict[str, Any], str, str, str | None]] = []
    roots = tree["root"]["children"]
    _push_children(stack, roots, "", None)
    while stack:
        node, lead, rest, above = stack.pop()
        label = f"{node['role']}: {preview_text(node['content'])}"
        if node["branchId"] != above:
            label += f"  [{names.get(node['branchId'], node['branchId'])}]"
        if "mergedFrom" in node:
            label += "  (merged)"
        if node["id"] == leaf:
            label += "  <- active"
        lines.append(lead + label)
        _push_children(stack, node["children"], rest, node["branchId"])
    if not roots:
        lines.append("(no messages)")
    return "\n".join(lines) + "\n"


def _push_children(
    stack: list[tuple[dict[str, Any], str, str, str | None]],
    children: Sequence[dict[str, Any]],
    prefix: str,
    branch: str | None,
) -> None:
    if len(children) == 1:
        stack.append((children[0], prefix, prefix, branch))
        return
    entries: Iterable[tuple[int, dict[str, Any]]] = reversed(list(enumerate(children)))
    for index, child in entries:
        last = index == len(children) - 1
        lead, rest = ("└─ ", "   ") if last else ("├─ ", "│  ")
        stack.append((child, prefix + lead, prefix + rest, branch))
