"""A conversation tree as one self-contained, interactive HTML page.

:func:`render_html` turns the JSON-ready tree (the specification's camelCase
keys: ``sessionId``, ``activeLeafId``, ``branches``, ``root``…) into a single
HTML document that needs nothing else: no network, no CDN, no fonts or images
from anywhere. An inline script lays the tree out (leaves take consecutive
slots, a parent sits centred over its children, depth runs downwards: O(n))
and draws it as inline SVG, with branch colours and a legend, zoom and pan,
a detail panel for the clicked message, search, and a "Download SVG" button.

Message content is untrusted. The data travels in a
``<script type="application/json">`` block in which ``<``, ``>``, ``&``,
U+2028 and U+2029 are written as ``\\uXXXX`` escapes, so no content can close
the block or open a comment (messages go in flat, in pre-order with parent
indices, so a conversation thousands of messages deep never meets ``json``'s
recursion limit); the script shows content with ``textContent``
only, never ``innerHTML``; and a Content-Security-Policy lets the page run
its own script (by hash) and fetch nothing at all.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

__all__ = ["render_html"]

_SCRIPT_SAFE = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)

_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
html, body { margin: 0; height: 100%; }
body {
  display: flex; flex-direction: column; font: 14px/1.4 system-ui, -apple-system,
  "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1d2329; background: #f6f7f9;
}
header {
  display: flex; flex-wrap: wrap; align-items: center; gap: 8px; padding: 8px 12px;
  background: #fff; border-bottom: 1px solid #d9dde3;
}
header h1 { font-size: 16px; margin: 0 12px 0 0; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; max-width: 40vw; }
header .spacer { flex: 1; }
#stats { color: #5b6570; font-size: 12px; }
#search { width: 18em; padding: 4px 8px; border: 1px solid #b9c0c9; border-radius: 4px; }
#match-count { min-width: 6em; color: #5b6570; font-size: 12px; }
button { padding: 4px 10px; border: 1px solid #b9c0c9; border-radius: 4px; background: #fff;
  cursor: pointer; font: inherit; }
button:hover { background: #eef1f5; }
main { flex: 1; display: flex; min-height: 0; }
#canvas { flex: 1; position: relative; min-width: 0; }
#tree { display: block; width: 100%; height: 100%; background: #fff; cursor: grab;
  touch-action: none; user-select: none; }
#tree.dragging { cursor: grabbing; }
#empty { position: absolute; inset: 0; display: flex; align-items: center;
  justify-content: center; color: #5b6570; font-size: 16px; }
aside { width: min(420px, 40vw); display: flex; flex-direction: column; min-height: 0;
  border-left: 1px solid #d9dde3; background: #fbfbfc; }
aside h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: #5b6570;
  margin: 12px 12px 6px; }
#legend { list-style: none; margin: 0; padding: 0 12px; max-height: 30vh; overflow: auto; }
#legend li { display: flex; align-items: center; gap: 6px; padding: 2px 4px; cursor: pointer;
  border-radius: 3px; }
#legend li:hover { background: #eef1f5; }
#legend .swatch { width: 12px; height: 12px; border-radius: 50%; flex: none; }
#legend .current { font-weight: 600; }
#detail { flex: 1; min-height: 0; overflow: auto; padding: 0 12px 12px; }
#detail dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 10px;
  margin: 0 0 8px; }
#detail dt { color: #5b6570; }
#detail dd { margin: 0; overflow-wrap: anywhere; }
#detail pre { margin: 0 0 8px; padding: 8px; background: #fff; border: 1px solid #e1e5ea;
  border-radius: 4px; white-space: pre-wrap; overflow-wrap: anywhere;
  font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
#detail-hint { color: #5b6570; }
#legend .agent::before { content: "\\1F916  "; }
[hidden] { display: none !important; }
@media print {
  header button, #search, #match-count { display: none; }
  body { height: auto; }
  main { display: block; }
  #canvas { height: 90vh; break-after: page; }
  aside { width: auto; border: 0; }
  #legend { max-height: none; }
}
"""

# Rules the drawing needs; the script puts them in a <style> inside the <svg>, so a
# downloaded SVG carries them and renders on its own.
_SVG_CSS = """
.edges path { fill: none; stroke-width: 1.6; stroke-opacity: .75;
  vector-effect: non-scaling-stroke; }
.edges path.active-path { stroke: #1d2329; stroke-width: 3.2; stroke-opacity: .9; }
.edges path.merge-edges { stroke: #7a8490; stroke-width: 1.4; stroke-dasharray: 4 3; }
.node { cursor: pointer; }
.node .dot { stroke: #fff; stroke-width: 1.5; }
.node .halo { fill: none; stroke-width: 3; visibility: hidden; }
.node text { font: bold 9px sans-serif; fill: #fff; text-anchor: middle;
  dominant-baseline: central; pointer-events: none; }
.node.on-path .dot { stroke: #1d2329; stroke-width: 2.5; }
.node.active-leaf .dot { stroke: #1d2329; stroke-width: 4; }
.node.match .halo { visibility: visible; stroke: #ff2d95; }
.node.selected .halo { visibility: visible; stroke: #1d2329; stroke-dasharray: 3 2; }
"""

# The page's script lives beside this module (``_tree.js``), read once on first use.
_SCRIPT_FILE = "_tree.js"


@functools.cache
def _template() -> str:
    """The page with ``@@TITLE@@`` and ``@@DATA@@`` to fill in: the script read from
    the package (once), its Content-Security-Policy hash computed from it."""
    # The leading newline keeps the script (and so its hash) what it was inline.
    source = resources.files("sessiontree.conversations").joinpath(_SCRIPT_FILE)
    script = ("\n" + source.read_text("utf-8")).replace("@@SVG_CSS@@", json.dumps(_SVG_CSS))
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; img-src data: blob:; \
base-uri 'none'; form-action 'none'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="sessiontree">
<title>@@TITLE@@</title>
<style>{_CSS}</style>
</head>
<body>
<header>
  <h1 id="title">@@TITLE@@</h1>
  <span id="stats"></span>
  <span class="spacer"></span>
  <input id="search" type="search" placeholder="Search messages (Enter: next)"
         aria-label="Search message content" autocomplete="off">
  <span id="match-count" aria-live="polite" data-count="0"></span>
  <button id="zoom-in" type="button" title="Zoom in">+</button>
  <button id="zoom-out" type="button" title="Zoom out">&minus;</button>
  <button id="zoom-reset" type="button" title="Reset the view">Reset</button>
  <button id="zoom-fit" type="button" title="Show the whole tree">Fit</button>
  <button id="download-svg" type="button">Download SVG</button>
  <button id="print" type="button" title="Print, or save as PDF">Print / PDF</button>
</header>
<main>
  <div id="canvas">
    <svg id="tree" xmlns="http://www.w3.org/2000/svg" role="img"
         aria-label="Conversation tree"><g id="viewport"></g></svg>
    <div id="empty" hidden>This conversation has no messages yet.</div>
  </div>
  <aside>
    <h2>Branches</h2>
    <ul id="legend"></ul>
    <h2>Message</h2>
    <div id="detail">
      <p id="detail-hint">Click a message in the tree to see it here.</p>
      <div id="detail-body" hidden>
        <dl>
          <dt>Role</dt><dd id="detail-role"></dd>
          <dt>Time</dt><dd id="detail-timestamp"></dd>
          <dt>Branch</dt><dd id="detail-branch"></dd>
          <dt>Id</dt><dd id="detail-id"></dd>
          <dt>Parent</dt><dd id="detail-parent"></dd>
          <dt>Session</dt><dd id="detail-session"></dd>
        </dl>
        <pre id="detail-content"></pre>
        <h2 id="detail-extra-title" hidden>More</h2>
        <pre id="detail-extra" hidden></pre>
      </div>
    </div>
  </aside>
</main>
<script type="application/json" id="tree-data">@@DATA@@</script>
<script>{script}</script>
</body>
</html>
"""


_PLACEHOLDER = re.compile(r"@@(TITLE|DATA)@@")


def _refuse(value: object) -> object:
    """``json.dumps`` hook: nested mappings become dicts; anything else is refused."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode a {type(value).__name__} as JSON: {value!r:.80}")


def _encode(value: object, what: str) -> str:
    """``value`` as JSON; a failure is re-raised (same type) naming ``what``."""
    try:
        return json.dumps(
            value, ensure_ascii=False, allow_nan=False, default=_refuse, separators=(",", ":")
        )
    except TypeError as exc:
        raise TypeError(f"render_html: {what}: {exc}") from exc
    except ValueError as exc:  # NaN or an infinity
        raise ValueError(f"render_html: {what}: {exc} (JSON has no NaN or infinity)") from exc
    except RecursionError as exc:
        raise ValueError(f"render_html: {what} is nested too deeply to encode") from exc


def _flatten(root: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    """Every message under ``root`` in pre-order, each encoded without its ``children``,
    and each one's parent index (-1 for the conversation's first messages).

    Iterative, so a conversation thousands of messages deep needs no recursion (the
    nested tree would exceed ``json.dumps``'s recursion limit long before that).
    """
    encoded: list[str] = []
    parents: list[int] = []
    seen: set[int] = set()
    stack: list[tuple[object, int, str]] = []

    def push_children(node: Mapping[str, Any], index: int, name: str) -> None:
        children = node.get("children", [])
        if not isinstance(children, list | tuple):
            raise TypeError(
                f"render_html: children of {name} must be a list, got {type(children).__name__}"
            )
        stack.extend(
            (child, index, f"child {i} of {name}")
            for i, child in reversed(list(enumerate(children)))
        )

    push_children(root, -1, "the root")
    while stack:
        node, parent, name = stack.pop()
        if not isinstance(node, Mapping):
            raise TypeError(f"render_html: {name} must be a mapping, got {type(node).__name__}")
        if id(node) in seen:
            raise ValueError(f"render_html: {name} appears twice in the tree (a cycle?)")
        seen.add(id(node))
        index = len(encoded)
        name = f"message {node.get('id')!r}"
        encoded.append(_encode({k: v for k, v in node.items() if k != "children"}, name))
        parents.append(parent)
        push_children(node, index, name)
    return encoded, parents


def render_html(tree: Mapping[str, Any], *, title: str = "Conversation tree") -> str:
    """One complete, self-contained HTML document that draws ``tree``.

    ``tree`` is the JSON-ready conversation tree (``sessionId``,
    ``activeLeafId``, ``currentBranchId``, ``branches``, and ``root`` whose
    ``children`` are the conversation's first messages, each with its own
    ``children``); nested mappings count as JSON objects. A ``root`` with no
    children is shown as an empty conversation. ``title`` is shown in the page's
    title and heading, HTML-escaped. The tree is walked without recursion, so a
    conversation of any depth renders. Pure: reads nothing but its arguments.

    Raises ``TypeError`` when ``tree`` or a node in it is not a mapping, a
    ``children`` is not a list, or a value JSON cannot encode appears (the message
    names the node and the value's type); ``ValueError`` when ``tree["root"]`` is
    missing, a value is NaN or an infinity, one node object appears twice (a cycle),
    or a value is nested too deeply for ``json``.
    """
    if not isinstance(tree, Mapping):
        raise TypeError(f"render_html: tree must be a mapping, got {type(tree).__name__}")
    root = tree.get("root")
    if not isinstance(root, Mapping):
        raise ValueError(f"render_html: tree['root'] must be a mapping, got {type(root).__name__}")
    nodes, parents = _flatten(root)
    header = _encode({k: v for k, v in tree.items() if k != "root"}, "the tree's header")
    data = f'{{"tree":{header},"parents":{json.dumps(parents)},"nodes":[{",".join(nodes)}]}}'
    values = {"TITLE": html.escape(title), "DATA": data.translate(_SCRIPT_SAFE)}
    return _PLACEHOLDER.sub(lambda match: values[match[1]], _template())
