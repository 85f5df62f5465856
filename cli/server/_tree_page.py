"""The session tree as pages a person reads: interactive HTML and SVG.

``GET /v1/sessions/{id}/tree.html`` shows the subtree under a session: each
session's kind, skill, state, age, usage (its own and its subtree's) and
result, with links to its conversation's page and to its own subtree; a
filter, expand and collapse, an SVG export and a print stylesheet (the
browser's print to PDF is the PDF export). ``tree.svg`` draws the same tree
as an SVG image. Both are pure functions of the tree the API already serves.
"""

from __future__ import annotations

import html
from collections.abc import Iterator

from sessiontree.cli._wire import TreeView
from sessiontree.protocol import Usage

__all__ = ["session_tree_html", "session_tree_svg"]

_STATE_COLOURS = {
    "pending": "#8a8a8a",
    "active": "#1f6feb",
    "suspended": "#9a6700",
    "completed": "#1a7f37",
    "failed": "#cf222e",
    "expired": "#bc4c00",
    "cancelled": "#6e7781",
}


def _walk(tree: TreeView, depth: int = 0) -> Iterator[tuple[int, TreeView]]:
    """Every session of ``tree`` with its depth below the root, depth first."""
    stack = [(depth, tree)]
    while stack:
        level, node = stack.pop()
        yield level, node
        stack.extend((level + 1, child) for child in reversed(node.children))


def _usage(usage: Usage | None) -> str:
    if usage is None or (not usage.calls and not usage.tokens):
        return ""
    return f"{usage.tokens:,} tokens · {usage.calls} calls · {usage.cost:.4g}"


def _node_html(node: TreeView, now: float) -> str:
    info = node.info
    sid = str(info.session_id)
    state = info.state.value
    ended = node.result.timings.ended_at if node.result and node.result.timings else None
    age = (ended or now) - info.created_at
    parts = [
        f'<span class="kind">{html.escape(info.kind.value)}</span>',
        f'<span class="skill">{html.escape(info.skill)}</span>',
        f'<span class="state" style="color:{_STATE_COLOURS.get(state, "#000")}">{state}</span>',
        f'<code title="{sid}">{sid[:8]}</code>',
        f'<span class="age">{age:.1f} s</span>',
    ]
    own, subtree = _usage(node.usage), _usage(node.subtree_usage)
    if own:
        parts.append(f'<span class="usage">{html.escape(own)}</span>')
    if subtree and subtree != own:
        parts.append(f'<span class="usage">Σ {html.escape(subtree)}</span>')
    links = (
        f'<a class="conversation" href="../{sid}/conversation/tree.html#session={sid}">'
        "conversation</a> "
        f'<a class="subtree" href="../{sid}/tree.html">subtree</a>'
    )
    detail = ""
    if info.task:
        detail += f'<div class="task">{html.escape(info.task[:300])}</div>'
    if node.result is not None:
        error = node.result.error
        said = node.result.summary[:300]
        if error is not None:
            said = f"{error.code.value}: {error.message[:300]}"
        detail += f'<div class="result">{html.escape(said)}</div>'
    return f"<summary>{' '.join(parts)} {links}</summary>{detail}"


def session_tree_html(tree: TreeView, now: float) -> str:
    """One self-contained page drawing ``tree`` (``now``: wall seconds, for ages)."""
    body: list[str] = []
    depth_open = 0
    for level, node in _walk(tree):
        while depth_open > level:  # close the siblings' and their children's
            body.append("</details>")
            depth_open -= 1
        info = node.info
        words = (info.kind.value, info.skill, info.state.value, str(info.session_id), info.task)
        text = " ".join(words).lower()
        body.append(
            f'<details open class="session" data-id="{node.info.session_id}" '
            f'data-text="{html.escape(text)}">{_node_html(node, now)}'
        )
        depth_open = level + 1
    body.extend("</details>" for _ in range(depth_open))
    states: dict[str, int] = {}
    for _, node in _walk(tree):
        states[node.info.state.value] = states.get(node.info.state.value, 0) + 1
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    root = tree.info
    title = f"Session tree of {root.kind.value} {root.skill} {str(root.session_id)[:8]}"
    return _PAGE.format(
        title=html.escape(title),
        counts=html.escape(counts),
        root=root.session_id,
        tree="\n".join(body),
    )


def session_tree_svg(tree: TreeView) -> str:
    """``tree`` as an SVG image: one row a session, indented by depth, with the
    lines of the tree and each session's state as a coloured dot."""
    rows = list(_walk(tree))
    height, indent, width = 24, 22, 900
    items: list[str] = []
    last_row_at: dict[int, int] = {}  # depth -> the row of the last session seen there
    for row, (level, node) in enumerate(rows):
        x, y = 12 + level * indent, 18 + row * height
        if level:
            parent_row = last_row_at[level - 1]
            px = 12 + (level - 1) * indent
            items.append(
                f'<path d="M{px} {18 + parent_row * height + 6} V{y} H{x - 6}" '
                'fill="none" stroke="#b0b7c3"/>'
            )
        last_row_at[level] = row
        info = node.info
        colour = _STATE_COLOURS.get(info.state.value, "#000")
        label = f"{info.kind.value} {info.skill} · {info.state.value} · {str(info.session_id)[:8]}"
        used = _usage(node.subtree_usage)
        if used:
            label += f" · Σ {used}"
        items.append(f'<circle cx="{x}" cy="{y}" r="5" fill="{colour}"/>')
        items.append(f'<text x="{x + 10}" y="{y + 4}">{html.escape(label)}</text>')
    total = 12 + len(rows) * height
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total}" '
        f'viewBox="0 0 {width} {total}" font-family="sans-serif" font-size="13">'
        + "".join(items)
        + "</svg>"
    )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #1f2328; }}
details {{ margin-left: 1.4em; border-left: 1px solid #d0d7de; padding-left: .5em; }}
body > main > details {{ margin-left: 0; border: 0; }}
summary {{ cursor: pointer; padding: .15em 0; }}
.kind {{ font-weight: 600; }} .skill {{ font-family: monospace; }}
.state {{ font-weight: 600; }} .usage, .age {{ color: #57606a; font-size: 90%; }}
.task, .result {{ color: #57606a; margin-left: 1.2em; font-size: 90%; white-space: pre-wrap; }}
.hidden {{ display: none; }}
nav button, nav input, nav a {{ margin-right: .5em; }}
@media print {{ nav, a.subtree {{ display: none; }} details {{ break-inside: avoid; }} }}
</style></head>
<body>
<h1>{title}</h1>
<p>{counts}</p>
<nav>
<input id="filter" type="search" placeholder="filter: kind, skill, state, id, task">
<button id="expand" type="button">Expand all</button>
<button id="collapse" type="button">Collapse all</button>
<a id="svg" href="tree.svg" download="session-tree-{root}.svg">SVG</a>
<button id="print" type="button">Print / PDF</button>
</nav>
<main>
{tree}
</main>
<script>
const all = () => document.querySelectorAll("details.session");
document.getElementById("expand").onclick = () => all().forEach(d => d.open = true);
document.getElementById("collapse").onclick = () => all().forEach(d => d.open = false);
document.getElementById("print").onclick = () => window.print();
window.addEventListener("beforeprint", () => all().forEach(d => d.open = true));
document.getElementById("filter").oninput = (event) => {{
  const wanted = event.target.value.trim().toLowerCase();
  all().forEach(d => d.classList.add("hidden"));
  all().forEach(d => {{
    if (!wanted || d.dataset.text.includes(wanted)) {{
      for (let up = d; up && up.matches("details.session"); up = up.parentElement) {{
        up.classList.remove("hidden");
        up.open = true;
      }}
    }}
  }});
}};
</script>
</body></html>
"""
