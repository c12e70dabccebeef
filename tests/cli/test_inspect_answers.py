"""The inspect page as a console that answers, in a real browser (Debian's headless
chromium through Playwright) against real services (``tests.agents.approvals`` in
their own processes, SQLite stores):

- a session started after the page loaded appears in its list without a reload (the
  list is a stream of changes), its usage shows while it waits for a person (before
  any terminal event reports one), and an approval given from the page lets it run
  the gated tool once and complete; a denial from the page completes another without
  running the tool;
- a client tool's result typed into the page completes the picker's session;
- a tree across services: the middle agent's child runs on the mailer's service; the
  page opens the child there, answers its approval on that service, and goes back to
  the middle session, which completes.

Under CI=true a missing chromium or Playwright fails the test; elsewhere it is skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helix_transport import AgentClient
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.agents.approvals import SENT_LOG
from tests.cli.test_inspect import WAIT_MS, browser, inspecting, node
from tests.helpers import ROOT

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

__all__ = ["browser"]  # the fixture, shared with test_inspect

pytestmark = pytest.mark.timeout(420)


def _service(name: str, tmp_path: Path, **env: str) -> ServiceProcess:
    return ServiceProcess(
        f"tests.agents.approvals:{name}", port=free_port(),
        store_url=f"sqlite:///{tmp_path}/{name}.db", log_path=tmp_path / f"{name}.log",
        env={"HELIX_LOG_LEVEL": "WARNING", SENT_LOG: str(tmp_path / "sent.jsonl"), **env},
        cwd=ROOT,
    )  # fmt: skip


@pytest.fixture
async def mailer(tmp_path: Path) -> AsyncIterator[ServiceProcess]:
    service = _service("mailer", tmp_path)
    await service.start(timeout_s=60)
    try:
        yield service
    finally:
        await service.stop()


async def _page(browser: Browser, url: str) -> Page:
    page = await browser.new_page(viewport={"width": 1500, "height": 900})
    page.set_default_timeout(WAIT_MS)
    await page.goto(url)
    return page


def _sent(tmp_path: Path) -> list[dict[str, str]]:
    path = tmp_path / "sent.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_an_approval_and_a_denial_from_the_page(
    browser: Browser, mailer: ServiceProcess, tmp_path: Path
) -> None:
    async with inspecting(mailer.address) as url:
        page = await _page(browser, url)
        await page.wait_for_selector("#service:has-text('hitl-mailer')")
        await page.evaluate("window.loadedOnce = true")  # gone if the page reloads

        # A session started after the page loaded appears in the list by itself.
        async with await AgentClient.connect(mailer.address) as client:
            await client.start(json.dumps({"to": "ops@example.com"}), session_id="ask-1")
        row = '#sessions tbody tr[data-session-id="ask-1"]'
        await page.wait_for_selector(row)
        await page.wait_for_selector(f'{row}[data-status="suspended"]')  # and follows it
        assert await page.evaluate("window.loadedOnce") is True

        # It waits for a person: the request, with its arguments, and the usage of the
        # step that asked, though no terminal event has reported any yet.
        await page.click(row)
        await page.wait_for_selector(node(page, "ask-1", "suspended"))
        request = page.locator('.request[data-request-id][data-kind="approval"]')
        await request.wait_for()
        arguments = json.loads(await request.locator(".arguments").text_content() or "")
        assert arguments["to"] == "ops@example.com"
        await page.wait_for_function(
            "Number(document.querySelector('#tree-totals').dataset.tokens) > 0"
        )
        assert await page.get_attribute(node(page, "ask-1"), "data-status") == "suspended"
        assert _sent(tmp_path) == []

        # Approved from the page: the tool runs once and the session completes.
        await request.locator("input.reason").fill("looks fine")
        await request.locator("button.approve").click()
        await page.wait_for_selector(".answer-result:has-text('approved (looks fine): sent')")
        await page.wait_for_selector(node(page, "ask-1", "completed"))
        await page.wait_for_selector("#tree-state[data-state='ended']")
        # Nothing waits any more; the answered request stays, marked, with its outcome.
        assert await page.locator(".request:not(.answered)").count() == 0
        assert await page.locator(".request.answered").count() == 1
        assert '"sent_to": "ops@example.com"' in (await page.text_content("#node-output") or "")
        answered = page.locator("#timeline li[data-kind='input_answered'] .what")
        assert "approved" in (await answered.text_content() or "")
        await page.wait_for_selector(f'{row}[data-status="completed"]')
        assert [s["session_id"] for s in _sent(tmp_path)] == ["ask-1"]

        # Denied from the page: the session completes without running the tool.
        async with await AgentClient.connect(mailer.address) as client:
            await client.start(json.dumps({"to": "all@example.com"}), session_id="ask-2")
        await page.click('#sessions tbody tr[data-session-id="ask-2"]')
        request = page.locator('.request[data-kind="approval"]')
        await request.wait_for()
        await request.locator("input.reason").fill("not to everyone")
        await request.locator("button.deny").click()
        await page.wait_for_selector(".answer-result:has-text('denied (not to everyone): sent')")
        await page.wait_for_selector(node(page, "ask-2", "completed"))
        output = await page.text_content("#node-output") or ""
        assert "was denied: not to everyone" in output, output
        assert [s["session_id"] for s in _sent(tmp_path)] == ["ask-1"]
        assert await page.evaluate("window.loadedOnce") is True


async def test_a_client_tool_result_from_the_page(browser: Browser, tmp_path: Path) -> None:
    picker = _service("picker", tmp_path)
    await picker.start(timeout_s=60)
    try:
        async with inspecting(picker.address) as url:
            page = await _page(browser, url)
            async with await AgentClient.connect(picker.address) as client:
                await client.start(json.dumps({"options": ["red", "blue"]}), session_id="pick-1")
            await page.click('#sessions tbody tr[data-session-id="pick-1"]')
            request = page.locator('.request[data-kind="client_result"]')
            await request.wait_for()
            assert "blue" in (await request.locator(".arguments").text_content() or "")
            text = request.locator("textarea.result")
            await text.fill("not json")  # refused on the page, nothing sent
            await request.locator("button.send-result").click()
            await request.locator(".error:has-text('not JSON')").wait_for()
            await text.fill('{"picked": "blue"}')
            await request.locator("button.send-result").click()
            await page.wait_for_selector(node(page, "pick-1", "completed"))
            assert '"picked": "blue"' in (await page.text_content("#node-output") or "")
    finally:
        await picker.stop()


async def test_the_page_follows_a_tree_onto_the_child_service(
    browser: Browser, mailer: ServiceProcess, tmp_path: Path
) -> None:
    """The middle agent's child runs on the mailer's service: the page opens it there
    (its session on that service, with the same credentials), answers it there, and
    goes back to the middle session, which completes."""
    registry = {address_env_var("hitl-mailer"): mailer.address}
    middle = _service("middle", tmp_path, **registry)
    await middle.start(timeout_s=60)
    try:
        async with inspecting(middle.address, env=registry) as url:
            page = await _page(browser, url)
            async with await AgentClient.connect(middle.address) as client:
                await client.start(json.dumps({"to": "ops@example.com"}), session_id="mid-1")
            await page.click('#sessions tbody tr[data-session-id="mid-1"]')
            child = page.locator('.node:has(.agent:text-is("hitl-mailer"))')
            await child.wait_for()
            child_id = await child.get_attribute("data-session-id")
            assert child_id
            await child.click()
            await page.click("#open-elsewhere")

            # The child's own session, on the mailer's service; its list is that one's.
            await page.wait_for_selector(f"#tree-title:text-is('Tree of {child_id}')")
            assert mailer.address in (await page.text_content("#tree-address") or "")
            assert await page.input_value("#service-select") == mailer.address
            await page.uncheck("#roots-only")  # the child has a parent
            await page.wait_for_selector(f'#sessions tbody tr[data-session-id="{child_id}"]')
            request = page.locator('.request[data-kind="approval"]')
            await request.wait_for()
            await request.locator("button.approve").click()
            await page.wait_for_selector(node(page, child_id, "completed"))

            # Back to the middle session, on its own service: it completes.
            await page.click("#back")
            await page.wait_for_selector("#tree-title:text-is('Tree of mid-1')")
            await page.wait_for_selector(node(page, "mid-1", "completed"))
            assert await page.input_value("#service-select") == middle.address
        assert [s["session_id"] for s in _sent(tmp_path)] == [child_id]
    finally:
        await asyncio.gather(middle.stop())
