"""The exported conversation-tree page, driven in real headless Chromium.

Uses Playwright's Python package with the system's Chromium (Debian's
``chromium``), never a downloaded browser. Without either, the tests skip;
under CI (``CI=true``) they fail instead, since ``.ci/run`` installs them.
"""

from __future__ import annotations

import os
import shutil
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from sessiontree.conversations import render_html

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

WAIT_MS = 10_000  # the longest any single browser wait in these tests may take
SVG_NS = "http://www.w3.org/2000/svg"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE_SCRIPT = "</script><script>window.__pwned=1</script>"
HOSTILE_IMG = '<img src=x onerror="window.__pwned=1"> <!-- \u2028 & </SCRIPT >'


def _missing(what: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing under CI: .ci/run installs Debian's chromium")
    pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless system Chromium for the whole module, closed at the end."""
    executable = shutil.which("chromium")
    if executable is None:
        _missing("chromium (Debian package chromium)")
    try:
        from playwright.sync_api import sync_playwright  # noqa: PLC0415
    except ImportError:
        _missing("the playwright Python package (pip install -e '.[test]')")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


# ---- trees built by hand ------------------------------------------------------------------


class TreeBuilder:
    """Builds the JSON-ready tree dict the page takes, message by message."""

    def __init__(self) -> None:
        self.root: dict[str, Any] = {"id": "root", "children": []}
        self.messages: dict[str, dict[str, Any]] = {}
        self.branches: list[dict[str, Any]] = []
        self._seconds = 0

    def branch(self, name: str, base: str | None = None) -> str:
        number = len(self.branches) + 1
        branch_id = f"branch_{number:08x}"
        self.branches.append(
            {
                "number": number,
                "id": branch_id,
                "name": name,
                "baseId": base,
                "leafId": base,
                "messageCount": 0,
                "current": False,
            }
        )
        return branch_id

    def add(self, parent: str | None, branch_id: str, role: str, content: Any, **extra: Any) -> str:
        message_id = str(uuid.uuid4())
        self._seconds += 1
        node: dict[str, Any] = {
            "id": message_id,
            "parentId": parent,
            "role": role,
            "content": content,
            "timestamp": f"2026-02-25T12:{self._seconds // 60 % 60:02d}:"
            f"{self._seconds % 60:02d}.000Z",
            "branchId": branch_id,
            "children": [],
            **extra,
        }
        siblings = self.root["children"] if parent is None else self.messages[parent]["children"]
        siblings.append(node)
        self.messages[message_id] = node
        for branch in self.branches:
            if branch["id"] == branch_id:
                branch["leafId"] = message_id
                branch["messageCount"] += 1
        return message_id

    def chain(self, parent: str | None, branch_id: str, count: int, word: str) -> str:
        last = parent
        for i in range(count):
            role = "user" if i % 2 == 0 else "assistant"
            last = self.add(last, branch_id, role, f"{word} message {i}")
        assert last is not None
        return last

    def tree(self, current: str) -> dict[str, Any]:
        for branch in self.branches:
            branch["current"] = branch["id"] == current
        leaf = next(b["leafId"] for b in self.branches if b["id"] == current)
        return {
            "sessionId": str(uuid.uuid4()),
            "activeLeafId": leaf,
            "currentBranchId": current,
            "branches": self.branches,
            "root": self.root,
        }


@dataclass
class BranchyTree:
    tree: dict[str, Any]
    ids: list[str]
    names: dict[str, str]  # branch id -> name
    dict_message: str
    active_path: list[str]


def branchy_tree() -> BranchyTree:
    """Three branches, twelve messages, one of them with dict content."""
    b = TreeBuilder()
    main = b.branch("main")
    system = b.add(None, main, "system", "You are a careful gardener.")
    ask = b.add(system, main, "user", "How do I grow tomatoes?")
    answer = b.add(ask, main, "assistant", "Plenty of sun, deep watering, and a stake.")
    follow = b.add(answer, main, "user", "What about basil next to them?")
    b.add(follow, main, "assistant", "Basil is a fine companion for TOMATOES.")
    alt = b.branch("shorter answers", base=ask)
    alt_answer = b.add(ask, alt, "assistant", "Sun and water.")
    alt_follow = b.add(alt_answer, alt, "user", "Say more about tomatoes please")
    dict_message = b.add(
        alt_follow,
        alt,
        "assistant",
        {"type": "tool_result", "items": ["tomato cage", "mulch"], "ok": True},
        toolCalls=[{"name": "lookup", "arguments": {"q": "tomato"}}],
    )
    tools = b.branch("tool detour", base=system)
    t1 = b.add(system, tools, "user", "Check the weather first.")
    t2 = b.add(t1, tools, "tool", "sunny, 24 C")
    t3 = b.add(t2, tools, "assistant", "It is sunny: water in the evening.")
    b.add(t3, tools, "user", "Thanks!", mergedFrom=answer)
    tree = b.tree(current=alt)
    active_path = [dict_message, alt_follow, alt_answer, ask, system]
    return BranchyTree(
        tree=tree,
        ids=list(b.messages),
        names={br["id"]: br["name"] for br in b.branches},
        dict_message=dict_message,
        active_path=active_path,
    )


def large_tree(total: int = 2000) -> dict[str, Any]:
    """``total`` messages: a main line and three branches forking off it."""
    b = TreeBuilder()
    main = b.branch("main")
    per_branch = total // 4
    spine = [b.add(None, main, "system", "start")]
    for i in range(per_branch - 1):
        spine.append(b.add(spine[-1], main, "user" if i % 2 else "assistant", f"main {i}"))
    for n in range(1, 4):
        base = spine[n * per_branch // 4]
        fork = b.branch(f"fork {n}", base=base)
        b.chain(base, fork, per_branch if n < 3 else total - 4 * per_branch + per_branch, "fork")
    assert len(b.messages) == total
    return b.tree(current=main)


# ---- the page under test ------------------------------------------------------------------


@dataclass
class Viewer:
    """One loaded page and what it did: console errors, page errors, outside requests."""

    page: Page
    errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)

    def transform(self) -> str:
        return self.page.get_attribute("#viewport", "transform") or ""

    def node_ids(self) -> list[str]:
        ids: list[str] = self.page.eval_on_selector_all(
            "g.node", "nodes => nodes.map(n => n.getAttribute('data-id'))"
        )
        return ids

    def classed(self, css_class: str) -> set[str]:
        return set(
            self.page.eval_on_selector_all(
                f"g.node.{css_class}", "nodes => nodes.map(n => n.getAttribute('data-id'))"
            )
        )

    def node(self, message_id: str) -> Any:
        return self.page.locator(f'g.node[data-id="{message_id}"]')

    def pwned(self) -> Any:
        return self.page.evaluate("() => window.__pwned")


@pytest.fixture
def open_tree(browser: Browser, tmp_path: Path) -> Iterator[Callable[..., Viewer]]:
    """Write the page for a tree into tmp_path and load it from its file:// URL.

    Every request that is not file:, data:, blob: or about: is recorded and aborted.
    """
    contexts: list[BrowserContext] = []

    def open_page(tree: dict[str, Any], title: str = "Conversation tree") -> Viewer:
        path = tmp_path / f"tree-{len(contexts)}.html"
        path.write_text(render_html(tree, title=title), encoding="utf-8")
        context = browser.new_context(
            accept_downloads=True, viewport={"width": 1200, "height": 800}
        )
        contexts.append(context)
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        viewer = Viewer(page)

        def on_request(request: Any) -> None:
            if not request.url.startswith(LOCAL_SCHEMES):
                viewer.outside_requests.append(request.url)

        def on_route(route: Any) -> None:
            if route.request.url.startswith(LOCAL_SCHEMES):
                route.continue_()
            else:
                viewer.outside_requests.append(route.request.url)
                route.abort()

        page.on("request", on_request)
        page.on("websocket", lambda ws: viewer.outside_requests.append(ws.url))
        page.on(
            "console",
            lambda msg: (
                viewer.errors.append(f"console: {msg.text}") if msg.type == "error" else None
            ),
        )
        page.on("pageerror", lambda exc: viewer.errors.append(f"pageerror: {exc}"))
        context.route("**/*", on_route)
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready='true']", state="attached")
        return viewer

    yield open_page
    for context in contexts:
        context.close()


# ---- the tests ----------------------------------------------------------------------------


def test_page_loads_from_a_file_without_any_network_request(
    open_tree: Callable[..., Viewer],
) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    # Use everything once, so a lazily fetched resource would show up too.
    viewer.node(sample.dict_message).click()
    viewer.page.fill("#search", "tomato")
    viewer.page.click("#zoom-in")
    with viewer.page.expect_download():
        viewer.page.click("#download-svg")
    assert viewer.outside_requests == []
    assert viewer.errors == []

    # The watch itself works: a page that does reach out (to loopback, aborted) is seen.
    probe = "http://127.0.0.1:9/probe.png"
    viewer.page.set_content(f'<img src="{probe}">')
    viewer.page.wait_for_function("() => document.images[0].complete")
    assert probe in viewer.outside_requests


def test_every_message_of_a_branchy_tree_is_drawn(open_tree: Callable[..., Viewer]) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    drawn = viewer.node_ids()
    assert len(drawn) == len(sample.ids) == 12
    assert set(drawn) == set(sample.ids)
    legend = viewer.page.locator("#legend li")
    assert legend.count() == 3
    assert "shorter answers" in legend.nth(1).inner_text()
    assert "(current)" in legend.nth(1).inner_text()
    assert "(current)" not in legend.nth(0).inner_text()
    fills = viewer.page.eval_on_selector_all(
        "g.node .dot", "dots => new Set(dots.map(d => d.getAttribute('fill'))).size"
    )
    assert fills == 3
    assert viewer.errors == []


def test_active_leaf_and_its_path_to_the_root_are_highlighted(
    open_tree: Callable[..., Viewer],
) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    assert viewer.classed("active-leaf") == {sample.active_path[0]}
    assert viewer.classed("on-path") == set(sample.active_path)


def test_clicking_a_node_shows_its_content_role_and_branch(
    open_tree: Callable[..., Viewer],
) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    page = viewer.page
    node = sample.tree["root"]["children"][0]["children"][0]  # "How do I grow tomatoes?"
    viewer.node(node["id"]).click()
    assert page.text_content("#detail-content") == "How do I grow tomatoes?"
    assert page.text_content("#detail-role") == "user"
    assert "main" in (page.text_content("#detail-branch") or "")
    assert page.text_content("#detail-id") == node["id"]
    assert page.text_content("#detail-timestamp") == node["timestamp"]
    assert viewer.classed("selected") == {node["id"]}

    viewer.node(sample.dict_message).click()
    shown = page.text_content("#detail-content") or ""
    assert '"items": [' in shown
    assert '"tomato cage"' in shown
    assert page.text_content("#detail-role") == "assistant"
    assert "shorter answers" in (page.text_content("#detail-branch") or "")
    assert "lookup" in (page.text_content("#detail-extra") or "")
    assert viewer.classed("selected") == {sample.dict_message}
    assert viewer.errors == []


def test_search_highlights_matches_and_counts_them(open_tree: Callable[..., Viewer]) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    page = viewer.page
    expected = {
        message_id
        for message_id in sample.ids
        if "tomato" in str(_content(sample.tree, message_id)).lower()
    }
    assert len(expected) == 4  # case-insensitive, and the dict content counts too
    page.fill("#search", "ToMaTo")
    assert viewer.classed("match") == expected
    assert page.get_attribute("#match-count", "data-count") == "4"
    assert (page.text_content("#match-count") or "").startswith("4 ")

    before = viewer.transform()
    page.press("#search", "Enter")
    assert len(viewer.classed("selected") & expected) == 1
    assert viewer.transform() != before
    assert page.text_content("#match-count") == "1 / 4"

    page.fill("#search", "no such words anywhere")
    assert viewer.classed("match") == set()
    assert page.get_attribute("#match-count", "data-count") == "0"
    page.fill("#search", "")
    assert page.text_content("#match-count") == ""
    assert viewer.errors == []


def _scale(transform: str) -> float:
    return float(transform.rsplit("scale(", 1)[1].rstrip(")"))


def _translate(transform: str) -> tuple[float, float]:
    inner = transform.split("translate(", 1)[1].split(")", 1)[0]
    x, y = inner.split()
    return float(x), float(y)


def test_zoom_buttons_and_wheel_zoom_and_drag_pans(open_tree: Callable[..., Viewer]) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    page = viewer.page
    start = viewer.transform()
    page.click("#zoom-in")
    assert _scale(viewer.transform()) == pytest.approx(_scale(start) * 1.25)
    page.click("#zoom-out")
    page.click("#zoom-out")
    assert _scale(viewer.transform()) == pytest.approx(_scale(start) * 0.8)
    page.click("#zoom-reset")
    assert viewer.transform() == start

    # The wheel zooms about the cursor: the drawing's point under it stays put.
    box = page.locator("#tree").bounding_box()
    assert box is not None
    # Whole pixels: Chromium reports the wheel's position rounded to them.
    cx, cy = int(box["x"]) + 200, int(box["y"]) + 150
    page.mouse.move(cx, cy)
    before = viewer.transform()
    k0, (x0, y0) = _scale(before), _translate(before)
    page.mouse.wheel(0, -200)
    page.wait_for_function(
        "before => document.getElementById('viewport').getAttribute('transform') !== before",
        arg=before,
    )
    after = viewer.transform()
    k1, (x1, y1) = _scale(after), _translate(after)
    assert k1 > k0
    local = (cx - box["x"] - x0) / k0, (cy - box["y"] - y0) / k0
    assert (cx - box["x"] - x1) / k1 == pytest.approx(local[0], abs=1e-6)
    assert (cy - box["y"] - y1) / k1 == pytest.approx(local[1], abs=1e-6)

    # A drag from empty space pans by the distance moved, and selects nothing.
    page.mouse.move(box["x"] + 10, box["y"] + box["height"] - 10)
    page.mouse.down()
    page.mouse.move(box["x"] + 70, box["y"] + box["height"] - 50, steps=5)
    page.mouse.up()
    x2, y2 = _translate(viewer.transform())
    assert (x2 - x1, y2 - y1) == pytest.approx((60, -40))
    assert _scale(viewer.transform()) == pytest.approx(k1)
    assert viewer.classed("selected") == set()
    assert viewer.errors == []


def test_download_svg_gives_a_standalone_svg_with_every_message(
    open_tree: Callable[..., Viewer], tmp_path: Path
) -> None:
    sample = branchy_tree()
    viewer = open_tree(sample.tree)
    with viewer.page.expect_download() as info:
        viewer.page.click("#download-svg")
    download = info.value
    assert download.suggested_filename == "conversation-tree.svg"
    saved = tmp_path / "saved.svg"
    download.save_as(saved)
    root = ET.parse(saved).getroot()
    assert root.tag == f"{{{SVG_NS}}}svg"
    nodes = [g for g in root.iter(f"{{{SVG_NS}}}g") if "node" in g.get("class", "").split()]
    assert sorted(g.get("data-id") for g in nodes) == sorted(sample.ids)
    styles = "".join(s.text or "" for s in root.iter(f"{{{SVG_NS}}}style"))
    assert ".node" in styles  # the rules travel with the file
    assert root.get("viewBox")
    assert viewer.errors == []


def test_hostile_content_is_shown_as_text_and_never_run(
    open_tree: Callable[..., Viewer],
) -> None:
    b = TreeBuilder()
    main = b.branch("</script><b>branch</b>")
    first = b.add(None, main, "user", HOSTILE_SCRIPT)
    second = b.add(first, main, "assistant", HOSTILE_IMG)
    third = b.add(second, main, "user", {"html": HOSTILE_SCRIPT, HOSTILE_IMG: 1})
    viewer = open_tree(b.tree(current=main), title="<script>window.__pwned=1</script>")
    page = viewer.page
    assert page.title() == "<script>window.__pwned=1</script>"
    assert set(viewer.node_ids()) == {first, second, third}
    for message_id, content in ((first, HOSTILE_SCRIPT), (second, HOSTILE_IMG)):
        viewer.node(message_id).click()
        assert page.text_content("#detail-content") == content
    viewer.node(third).click()
    assert HOSTILE_SCRIPT in (page.text_content("#detail-content") or "")
    assert page.locator("img").count() == 0
    assert page.locator("b").count() == 0
    assert "<b>branch</b>" in page.inner_text("#legend")
    assert viewer.pwned() is None
    assert viewer.errors == []
    assert viewer.outside_requests == []


def test_an_empty_conversation_renders_and_says_so(open_tree: Callable[..., Viewer]) -> None:
    tree = {
        "sessionId": str(uuid.uuid4()),
        "activeLeafId": None,
        "currentBranchId": "branch_00000001",
        "branches": [
            {
                "number": 1,
                "id": "branch_00000001",
                "name": "main",
                "baseId": None,
                "leafId": None,
                "messageCount": 0,
                "current": True,
            }
        ],
        "root": {"id": "root", "children": []},
    }
    viewer = open_tree(tree)
    assert viewer.node_ids() == []
    assert viewer.page.is_visible("#empty")
    assert "no messages" in viewer.page.inner_text("#empty")
    viewer.page.click("#zoom-in")
    viewer.page.click("#zoom-reset")
    viewer.page.fill("#search", "anything")
    assert viewer.page.get_attribute("#match-count", "data-count") == "0"
    assert viewer.errors == []


def test_a_tree_of_two_thousand_messages_draws_every_node(
    open_tree: Callable[..., Viewer],
) -> None:
    tree = large_tree(2000)
    viewer = open_tree(tree)
    drawn = viewer.node_ids()
    assert len(drawn) == 2000
    assert set(drawn) == set(_all_ids(tree))
    viewer.page.fill("#search", "fork message 7")
    # "fork message 7" and "…70" to "…79" in each of the three forks of 500 messages
    assert viewer.page.get_attribute("#match-count", "data-count") == str(3 * (1 + 10))
    assert viewer.errors == []


def test_render_html_refuses_what_json_cannot_carry_naming_the_message() -> None:
    def tree_of(content: Any) -> dict[str, Any]:
        return {"root": {"id": "root", "children": [{"id": "m1", "content": content}]}}

    with pytest.raises(TypeError, match=r"message 'm1'.*set"):
        render_html(tree_of({1, 2}))
    with pytest.raises(ValueError, match=r"message 'm1'.*NaN"):
        render_html(tree_of(float("nan")))
    with pytest.raises(TypeError, match="child 1 of the root must be a mapping"):
        render_html({"root": {"id": "root", "children": [{"id": "m1"}, "m2"]}})
    with pytest.raises(ValueError, match="root"):
        render_html({"branches": []})
    looped: dict[str, Any] = {"id": "m1", "children": []}
    looped["children"].append(looped)
    with pytest.raises(ValueError, match="appears twice"):
        render_html({"root": {"id": "root", "children": [looped]}})


def test_a_conversation_thousands_of_messages_deep_starts_at_its_active_leaf(
    open_tree: Callable[..., Viewer],
) -> None:
    b = TreeBuilder()
    main = b.branch("main")
    leaf = b.chain(None, main, 3000, "deep")  # far past json's recursion limit if nested
    viewer = open_tree(b.tree(current=main))
    assert len(viewer.node_ids()) == 3000
    # Too tall to show legibly at once: the first view is centred on the active leaf.
    canvas = viewer.page.locator("#tree").bounding_box()
    dot = viewer.node(leaf).bounding_box()
    assert canvas is not None
    assert dot is not None
    assert canvas["y"] < dot["y"] < canvas["y"] + canvas["height"]
    assert canvas["x"] < dot["x"] < canvas["x"] + canvas["width"]
    assert viewer.errors == []


def test_the_embedded_data_cannot_close_its_script_block() -> None:
    page = render_html(
        {"root": {"id": "root", "children": [{"id": "x", "content": HOSTILE_SCRIPT}]}},
        title="a </title> & b",
    )
    assert page.count("</script>") == 2  # the data block's and the program's own
    assert "<!--" not in page
    assert "a &lt;/title&gt; &amp; b" in page


def _all_ids(tree: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    stack = list(tree["root"]["children"])
    while stack:
        node = stack.pop()
        ids.append(node["id"])
        stack.extend(node["children"])
    return ids


def _content(tree: dict[str, Any], message_id: str) -> Any:
    stack = list(tree["root"]["children"])
    while stack:
        node = stack.pop()
        if node["id"] == message_id:
            return node["content"]
        stack.extend(node["children"])
    raise KeyError(message_id)
