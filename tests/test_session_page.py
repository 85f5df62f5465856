"""The session tree's pages (issue 25's pages): ``tree.html`` opened in headless
Chromium (filter, links into the conversation, print to PDF read back with
pypdf) and ``tree.svg`` parsed as XML, served by a real node on 127.0.0.1;
and the conversation's page, where a sub-agent's message names its session."""

from __future__ import annotations

import io
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pypdf
import pytest

from sessiontree.actors import AsyncSession
from sessiontree.protocol import SessionKind, SpawnSpec
from sessiontree.supervision import Agent, Node, NodeConfig
from tests._served import ServedNode
from tests.conftest import WAIT
from tests.test_tree_html import browser  # noqa: F401 - the module's Chromium fixture

pytestmark = pytest.mark.timeout(120)


async def inbox(session: AsyncSession) -> None:
    return None


async def lead(session: AsyncSession) -> str:
    await session.add_message("assistant", "two papers to review")
    await session.spawn_many(
        [
            SpawnSpec(kind=SessionKind.WORKER, skill="ok", task="read the paper"),
            SpawnSpec(kind=SessionKind.WORKER, skill="crash", task="parse the corrupt PDF"),
        ]
    )
    await session.collect()
    return "led two workers"


async def ok(session: AsyncSession) -> str:
    await session.add_message("assistant", "the paper reads well")
    return "read it"


async def crash(session: AsyncSession) -> None:
    raise RuntimeError("the PDF is corrupt")


@pytest.fixture
def served() -> Iterator[tuple[ServedNode, uuid.UUID]]:
    """A node serving a Main whose lead branch ran two workers (one crashed),
    and the Main's id."""
    skills = {"inbox": inbox, "lead": lead, "ok": ok, "crash": crash}
    node = Node([Agent("pages", skills, main_skill="inbox")], NodeConfig())
    served = ServedNode(node)
    try:
        main = node.main("pages")
        result = main.run(kind="branch", skill="lead", task="review the papers", timeout=WAIT)
        assert result is not None
        assert node.wait_idle(WAIT)
        yield served, main.session_id
    finally:
        served.close()
        node.shutdown()


@pytest.fixture
def tree_page(served: tuple[ServedNode, uuid.UUID], browser: Any) -> Iterator[Any]:  # noqa: F811
    """The Main's tree page, open in headless Chromium."""
    node, main_id = served
    page = browser.new_page()
    try:
        response = page.goto(f"{node.url}/v1/sessions/{main_id}/tree.html")
        assert response is not None
        assert response.status == 200
        yield page
    finally:
        page.close()


def test_the_tree_page_shows_every_session_and_links_into_its_conversation(
    tree_page: Any,
) -> None:
    page = tree_page
    sessions = page.locator("details.session")
    assert sessions.count() == 4  # the Main, the lead, two workers
    failed = page.locator("details.session", has_text="parse the corrupt PDF").last
    assert "failed" in failed.locator("summary .state").first.inner_text()
    assert "crashed" in failed.inner_text()

    page.fill("#filter", "corrupt")  # the match and its ancestors stay
    visible = [s for s in sessions.all() if s.is_visible()]
    assert len(visible) == 3

    failed.locator("a.conversation").first.click()
    page.wait_for_load_state()
    assert "/conversation/tree.html" in page.url
    assert page.title()  # the conversation's own page answered


def test_the_tree_page_prints_to_a_pdf_that_holds_the_tree(tree_page: Any) -> None:
    tree_page.locator("#collapse").click()  # printing opens every session again
    pdf = tree_page.pdf()
    assert pdf.startswith(b"%PDF")
    text = "".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    for expected in ("lead", "parse the corrupt PDF", "read the paper", "crashed"):
        assert expected in text
    assert "Expand all" not in text  # the print stylesheet drops the controls


def test_the_tree_svg_draws_one_row_a_session(served: tuple[ServedNode, uuid.UUID]) -> None:
    node, main_id = served
    answer = node.http.get(f"/v1/sessions/{main_id}/tree.svg")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("image/svg+xml")
    svg = ET.fromstring(answer.text)
    ns = "{http://www.w3.org/2000/svg}"
    rows = [t.text or "" for t in svg.iter(f"{ns}text")]
    assert len(rows) == 4
    assert rows[0].startswith("main inbox")
    assert any("failed" in row and row.startswith("worker crash") for row in rows)
    assert len(list(svg.iter(f"{ns}path"))) == 3  # a line to every session but the root


def test_a_page_for_an_unknown_session_is_a_404_naming_it(
    served: tuple[ServedNode, uuid.UUID],
) -> None:
    node, _ = served
    unknown = uuid.uuid4()
    for page in ("tree.html", "tree.svg"):
        answer = node.http.get(f"/v1/sessions/{unknown}/{page}")
        assert answer.status_code == 404
        assert str(unknown) in answer.text


# -- the conversation's page ------------------------------------------------------------------


def test_a_sub_agents_message_on_the_conversation_page_names_its_session(
    served: tuple[ServedNode, uuid.UUID],
    browser: Any,  # noqa: F811
) -> None:
    node, main_id = served
    conversation = node.node.conversation(main_id)
    (landed,) = [m for m in conversation.context(10) if m.session_id is not None]
    lead = node.node.get(landed.session_id)
    page = browser.new_page()
    try:
        response = page.goto(f"{node.url}/v1/sessions/{main_id}/conversation/tree.html")
        assert response is not None
        assert response.status == 200
        page.wait_for_selector("body[data-ready='true']")
        assert page.locator("#legend li.agent").count() == 1  # the lead's branch
        page.locator(f'g.node[data-id="{landed.id}"]').click()
        link = page.locator("#detail-session-link")
        assert link.inner_text() == "branch lead \u2014 completed"
        link.click()
        page.wait_for_load_state()
        assert page.url.endswith(f"/v1/sessions/{lead.session_id}/tree.html")
        assert "review the papers" in page.inner_text("body")

        # the lead's own page links back to its message in the conversation
        page.goto(f"{node.url}/v1/sessions/{main_id}/tree.html")
        own = page.locator("details.session", has_text="review the papers").last  # not the Main
        own.locator("a.conversation").first.click()
        page.wait_for_selector("body[data-ready='true']")
        assert f"#session={lead.session_id}" in page.url
        assert page.inner_text("#detail-branch").startswith("branch:lead-")  # its last message
    finally:
        page.close()


def test_the_conversation_page_prints_to_a_pdf(
    served: tuple[ServedNode, uuid.UUID],
    browser: Any,  # noqa: F811
) -> None:
    node, main_id = served
    page = browser.new_page()
    try:
        page.goto(f"{node.url}/v1/sessions/{main_id}/conversation/tree.html")
        page.wait_for_selector("body[data-ready='true']")
        assert page.locator("#print").is_visible()
        pdf = page.pdf()
    finally:
        page.close()
    assert pdf.startswith(b"%PDF")
    text = "".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    assert "lead" in text  # the legend names the sub-agent's branch
    assert "Print / PDF" not in text  # the print stylesheet drops the controls
