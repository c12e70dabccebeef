"""``helix-mesh inspect`` in a real browser: Debian's headless chromium, driven by
Playwright, on the page a real ``helix-mesh inspect`` process serves for a real mesh
(a parent service delegating to a child service, two processes with SQLite stores).

The test watches the tree grow while the delegation runs, opens a child's timeline,
SIGKILLs and restarts the child's service and then the parent's, interrupts a running
child from the page, sees the tree complete, and sees markup in a session's input shown
as text. A second test follows the demo's mesh (``make demo``: orchestrator, researcher
and summarizer on the scripted model) the same way, through a researcher's SIGKILL and
restart. A third asks a person's approval and shows the request in the timeline with
its text, and a fourth draws one event of every kind the proto has (the feed's own
messages, served in place of a live stream): each row shows its kind's summary, the
text ``helix-mesh call`` prints. Under CI=true a missing chromium or Playwright fails
the test; elsewhere it is skipped.

``HELIX_SCREENSHOT_DIR=docs`` also saves the finished tree as ``inspect.png`` there
(the picture in the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helix_transport import AgentClient, SessionTree
from helix_transport._events import summarize
from helix_transport.agent.tools import child_scope
from helix_transport.cli.inspector.feed import event_json
from helix_transport.delegation.remote import child_session_id
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from services import demo
from tests.conftest import unreachable
from tests.helpers import ROOT
from tests.test_event_kinds import one_of_each

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Route

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
HAVE_CHROMIUM = Path(CHROMIUM).exists()
WAIT_MS = 90_000  # a loaded machine restarts a service in seconds, not milliseconds

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not HAVE_CHROMIUM:
        unreachable(f"{CHROMIUM} is missing (make services-install installs Debian's chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unreachable("playwright is not installed (pip install -e '.[dev]')")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[dict[str, ServiceProcess]]:
    """The child (counter) and the parent (delegator), slowed to a visible pace."""
    pace = {"HELIX_SCRIPTED_DELAY_MS": "60", "HELIX_LOG_LEVEL": "WARNING"}
    child = ServiceProcess(
        "tests.agents:counter", port=free_port(), store_url=f"sqlite:///{tmp_path}/c.db",
        log_path=tmp_path / "counter.log", env=pace, cwd=ROOT,
    )  # fmt: skip
    parent = ServiceProcess(
        "tests.agents:delegator", port=free_port(), store_url=f"sqlite:///{tmp_path}/d.db",
        log_path=tmp_path / "delegator.log", cwd=ROOT,
        env={**pace, address_env_var("counter"): child.address},
    )  # fmt: skip
    try:
        await asyncio.gather(child.start(timeout_s=60), parent.start(timeout_s=60))
        yield {"child": child, "parent": parent}
    finally:
        await asyncio.gather(child.stop(), parent.stop())


@contextlib.asynccontextmanager
async def inspecting(address: str, env: dict[str, str] | None = None) -> AsyncIterator[str]:
    """``helix-mesh inspect ADDRESS --port 0`` as a process (``env`` added to its
    environment: the mesh registry); the URL it prints."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "inspect", address, "--port", "0",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("helix-mesh inspect: http://127.0.0.1:"), line
        yield line.split()[2]
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


@pytest.fixture
async def inspect_url(services: dict[str, ServiceProcess]) -> AsyncIterator[str]:
    async with inspecting(services["parent"].address) as url:
        yield url


def node(page: Page, session_id: str, status: str | None = None) -> str:
    """The selector of a tree node (in ``status``, if given)."""
    selector = f'.node[data-session-id="{session_id}"]'
    return selector + (f'[data-status="{status}"]' if status else "")


@pytest.mark.slow  # the default run follows the demo mesh and a tree onto its child service
async def test_the_page_follows_a_delegation_through_restarts_and_an_interrupt(
    browser: Browser, services: dict[str, ServiceProcess], inspect_url: str, tmp_path: Path
) -> None:
    parent, child = services["parent"], services["child"]
    page = await browser.new_page(viewport={"width": 1500, "height": 900})
    page.set_default_timeout(WAIT_MS)
    await page.goto(inspect_url)
    await page.wait_for_selector("#service:has-text('delegator')")

    short = {"tool": "count", "args": {"steps": 6, "words": 6}}
    long = {"tool": "count", "args": {"steps": 50, "words": 20}}  # a minute: interrupted first
    async with await AgentClient.connect(parent.address) as client:
        await client.start(json.dumps({"calls": [short, long]}), session_id="run-1")
    scope = child_scope("delegator", "")
    first, second = (child_session_id("run-1", f"call_1_{i}", scope) for i in (0, 1))

    # The session appears in the recent sessions (ListSessions); its tree grows live.
    await page.click('#sessions tbody tr[data-session-id="run-1"]')
    await page.wait_for_selector(node(page, "run-1", "running"))
    await page.wait_for_selector(node(page, second, "running"))
    await page.wait_for_selector(node(page, first))
    assert await page.locator("#tree-state").get_attribute("data-state") == "live"

    # A child's timeline: its own events, unwrapped from the parent's log.
    await page.click(node(page, second))
    await page.wait_for_selector("#timeline li[data-kind='tool_start']")
    assert await page.text_content("#node-session") == second
    assert '"steps": 50' in (await page.text_content("#node-input") or "")

    # The child's service dies mid-run and comes back, then the parent's (whose log the
    # page streams, resuming from its last sequence): the child's timeline goes on.
    for service in (child, parent):
        ticks = await page.locator("#timeline li[data-kind='tool_start']").count()
        await service.kill()
        await service.start(timeout_s=60)
        await page.wait_for_function(
            "n => document.querySelectorAll(\"#timeline li[data-kind='tool_start']\").length > n",
            arg=ticks,
        )
    await page.wait_for_selector(node(page, first, "completed"))

    # Interrupt the long child from the page, with the CLI's credentials.
    await page.wait_for_selector("#interrupt:not([disabled])")
    await page.click("#interrupt")
    await page.wait_for_selector("#interrupt-result:has-text('interrupt recorded')")
    await page.wait_for_selector(node(page, second, "interrupted"))

    # The root ends with both children accounted for; the stream is over.
    await page.wait_for_selector(node(page, "run-1", "completed"))
    await page.wait_for_selector("#tree-state[data-state='ended']")
    assert await page.locator(".node").count() == 3
    await page.click(node(page, "run-1"))
    output = await page.text_content("#node-output") or ""
    assert '"total": 6' in output  # the first child's result, in the root's output
    totals = await page.text_content("#tree-totals") or ""
    assert totals.startswith("3 sessions · ") and " tokens in all" in totals

    picture = tmp_path / "inspect.png"
    await page.screenshot(path=str(picture), full_page=True)
    assert picture.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("HELIX_SCREENSHOT_DIR"):
        shutil.copy(picture, Path(os.environ["HELIX_SCREENSHOT_DIR"]) / "inspect.png")

    # Event text is untrusted: markup in an input shows as text and never runs.
    hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    marked = {"tool": "count", "args": {"steps": 1, "words": 1, "note": hostile}}
    async with await AgentClient.connect(parent.address) as client:
        await client.start(json.dumps({"calls": [marked]}), session_id="run-2")
        await client.wait("run-2")
    await page.click('#sessions tbody tr[data-session-id="run-2"]')
    await page.wait_for_selector("#tree-state[data-state='ended']")
    await page.click(node(page, "run-2"))
    assert json.dumps(hostile) in (await page.text_content("#node-input") or "")
    await page.wait_for_selector("#timeline li[data-kind='tool_start']:has-text('onerror')")
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("window.pwned") is None


@pytest.mark.parametrize(
    "restart",
    # The first test follows a tree through restarts already: the demo's, behind -m slow.
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["straight", "researcher-restart"],
)
async def test_the_page_follows_the_demo_mesh(
    browser: Browser, tmp_path: Path, restart: bool
) -> None:
    """The demo's mesh (``make demo``: orchestrator, researcher, summarizer on the scripted
    model) asked the demo's question: the tree grows, a child's timeline shows its own
    events, (with ``restart``) the researcher's service is SIGKILLed mid-run and restarted
    on the same port and store, and the tree still completes with its totals."""
    # Slow enough to see a researcher running (and, with restart, to kill it mid-run).
    delay = "100" if restart else "30"
    pace = {"HELIX_SCRIPTED_DELAY_MS": delay, "HELIX_LOG_LEVEL": "WARNING"}
    services = demo.mesh(tmp_path, pace)
    try:
        await asyncio.gather(*(s.start(timeout_s=60) for s in services.values()))
        async with inspecting(services["orchestrator"].address) as url:
            page = await browser.new_page(viewport={"width": 1500, "height": 900})
            page.set_default_timeout(WAIT_MS)
            await page.goto(url)
            await page.wait_for_selector("#service:has-text('orchestrator')")
            async with await AgentClient.connect(services["orchestrator"].address) as client:
                question = json.dumps({"question": demo.QUESTION})
                await client.start(question, session_id="demo-1")
            await _follow_the_demo(page, services, restart=restart)
    finally:
        await asyncio.gather(*(s.stop() for s in services.values()))


async def _follow_the_demo(
    page: Page, services: dict[str, ServiceProcess], *, restart: bool
) -> None:
    # The tree grows while the root runs: a researcher appears under the orchestrator.
    await page.click('#sessions tbody tr[data-session-id="demo-1"]')
    await page.wait_for_selector(node(page, "demo-1", "running"))
    researching = '.node[data-status="running"]:has(.agent:text-is("researcher"))'
    researcher = page.locator(researching).first
    await researcher.wait_for()
    assert await page.get_attribute(node(page, "demo-1"), "data-status") == "running"
    assert await page.locator(".node").count() > 1
    assert await page.locator("#tree-state").get_attribute("data-state") == "live"

    # The researcher's timeline: its own events, unwrapped from the orchestrator's log.
    # Its node found by its agent alone: it may have finished since it was seen running.
    any_researcher = page.locator('.node:has(.agent:text-is("researcher"))').first
    child = await any_researcher.get_attribute("data-session-id")
    assert child and child != "demo-1"
    await page.click(node(page, child))
    await page.wait_for_selector("#timeline li")
    assert await page.text_content("#node-session") == child
    assert await page.locator("#timeline li[data-kind='subagent_start']").count() == 0

    if restart:  # the researcher's service dies mid-run, back on its port and store
        await services["researcher"].kill()
        await services["researcher"].start(timeout_s=60)

    # The root ends with every node in a final status, the summarizer's included.
    await page.wait_for_selector(node(page, "demo-1", "completed"))
    await page.wait_for_selector("#tree-state[data-state='ended']")
    await page.wait_for_selector(node(page, child, "completed"))
    statuses = await page.eval_on_selector_all(".node", "ns => ns.map(n => n.dataset.status)")
    agents = await page.eval_on_selector_all(".node .agent", "ns => ns.map(n => n.textContent)")
    assert len(statuses) >= 3 and set(statuses) == {"completed"}, statuses
    assert agents[0] == "orchestrator" and {"researcher", "summarizer"} <= set(agents), agents
    totals = await page.text_content("#tree-totals") or ""
    assert totals.startswith(f"{len(statuses)} sessions · ") and " tokens in all" in totals
    assert not totals.startswith(f"{len(statuses)} sessions · 0 tokens"), totals
    await page.click(node(page, "demo-1"))
    assert '"findings"' in (await page.text_content("#node-output") or "")


async def test_the_page_shows_a_request_for_input_with_its_text(
    browser: Browser, tmp_path: Path
) -> None:
    """A mailer whose ``send`` waits for a person's approval: its timeline shows the
    ``input_required`` row with what the CLI prints for it, then ``suspended``."""
    mailer = ServiceProcess(
        "tests.agents.approvals:mailer", port=free_port(), store_url=f"sqlite:///{tmp_path}/m.db",
        log_path=tmp_path / "mailer.log", env={"HELIX_LOG_LEVEL": "WARNING"}, cwd=ROOT,
    )  # fmt: skip
    await mailer.start(timeout_s=60)
    try:
        async with inspecting(mailer.address) as url:
            page = await browser.new_page(viewport={"width": 1500, "height": 900})
            page.set_default_timeout(WAIT_MS)
            await page.goto(url)
            await page.wait_for_selector("#service:has-text('hitl-mailer')")
            async with await AgentClient.connect(mailer.address) as client:
                await client.start(json.dumps({"to": "ops@example.com"}), session_id="ask-1")
            await page.click('#sessions tbody tr[data-session-id="ask-1"]')
            await page.wait_for_selector(node(page, "ask-1", "suspended"))
            asked = page.locator("#timeline li[data-kind='input_required']")
            await asked.wait_for()
            what = await asked.locator(".what").text_content() or ""
            assert what.startswith('? approval needed for send({"to": "ops@example.com"'), what
            assert await asked.locator(".lead.tone-ask").text_content() == "? approval needed"
            waits = page.locator("#timeline li[data-kind='suspended'] .what")
            assert await waits.text_content() == "suspended: waiting for 1 request(s)"
    finally:
        await mailer.stop()


def _server_sent(name: str, data: object) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def test_the_page_shows_every_kind_of_event_with_its_summary(browser: Browser) -> None:
    """One event of each kind, folded and sent as the feed sends them, to the page a
    real ``helix-mesh inspect`` serves (the kinds' table from its /api/event-kinds)."""
    events = one_of_each()
    tree = SessionTree()
    sent: list[dict[str, object]] = []
    for event in events:
        touched = tree.add(event)
        sent.append(event_json(touched.session_id, touched.events[-1]))
    assert tree.root is not None
    body = (
        "retry: 600000\n\n"
        + _server_sent("state", {"state": "live", "detail": ""})
        + _server_sent("events", {"events": sent})
        + _server_sent("tree", {"tree": tree.root.to_json()})
        + _server_sent("state", {"state": "ended", "detail": ""})
    )

    async def stream(route: Route) -> None:
        await route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    async with inspecting(f"127.0.0.1:{free_port()}") as url:  # no service: the stream is ours
        page = await browser.new_page(viewport={"width": 1500, "height": 900})
        page.set_default_timeout(WAIT_MS)
        await page.route(lambda url: "/api/sessions/root/stream" in url, stream)
        await page.goto(url + "#session=root")
        await page.wait_for_selector("#tree-state[data-state='ended']")
        await page.wait_for_selector(node(page, "root"))
        forwarded = None
        for event in events:
            kind = event.WhichOneof("payload")
            if kind == "child_event":  # drawn as the child's own event, in its timeline
                forwarded = event.child_event.event
                continue
            row = page.locator(
                f"#timeline li[data-kind='{kind}'][data-sequence='{event.sequence}']"
            )
            assert await row.locator(".what").text_content() == str(summarize(event)), kind
        assert forwarded is not None
        await page.click(node(page, forwarded.session_id))
        row = page.locator(f"#timeline li[data-sequence='{forwarded.sequence}']")
        assert await row.get_attribute("data-kind") == forwarded.WhichOneof("payload")
        assert await row.locator(".what").text_content() == str(summarize(forwarded))
        failed = page.locator("#timeline li[data-kind='failed']")
        assert await failed.count() == 0  # the child's timeline holds only its own
        await page.click(node(page, "root"))
        assert "bad" in (await failed.get_attribute("class") or "")
        completed = page.locator("#timeline li[data-kind='completed']")
        assert "terminal" in (await completed.get_attribute("class") or "")
