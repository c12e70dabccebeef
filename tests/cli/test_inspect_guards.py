"""The ``helix-mesh inspect`` process (a real one) guards the credentials it calls with:
only requests addressed to 127.0.0.1 or localhost, an interrupt only with the page's
header and only toward a service it inspects; errors are JSON a page can show."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest

from helix_transport.testing.processes import free_port
from tests.helpers import ROOT


@pytest.fixture
async def page_url() -> AsyncIterator[str]:
    """``helix-mesh inspect`` of a service that is not there."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "inspect", f"127.0.0.1:{free_port()}",
        "--port", "0", "--session", "s/1",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = line.split()[2]
        assert url.endswith("/#session=s%2F1"), line  # --session: the URL that opens it
        yield url.split("#")[0]
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def _fetch(
    url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def fetch(url: str, **kwargs: object) -> tuple[int, bytes]:
    return await asyncio.to_thread(_fetch, url, **kwargs)  # type: ignore[arg-type]


async def test_the_page_answers_only_for_loopback_and_its_own_script(page_url: str) -> None:
    status, page = await fetch(page_url)
    assert status == 200 and b"Content-Security-Policy" in page
    status, script = await fetch(page_url + "static/app.js")
    assert status == 200 and b"textContent" in script and b"innerHTML" not in script

    # DNS rebinding: another name for this address is refused.
    status, _ = await fetch(page_url + "api/info", headers={"Host": "attacker.example"})
    assert status == 400

    interrupt = page_url + "api/interrupt"
    asked = json.dumps({"session_id": "s1"}).encode()
    status, reply = await fetch(interrupt, body=asked)  # a cross-site form could send this
    assert status == 403 and json.loads(reply) == {"error": "missing header X-Helix-Inspect"}
    guard = {"X-Helix-Inspect": "1", "Content-Type": "application/json"}
    elsewhere = json.dumps({"session_id": "s1", "address": "10.1.2.3:443"}).encode()
    status, reply = await fetch(interrupt, body=elsewhere, headers=guard)
    assert status == 403 and "not one this page inspects" in json.loads(reply)["error"]
    status, reply = await fetch(interrupt, body=b"[1]", headers=guard)
    assert status == 400 and "session_id" in json.loads(reply)["error"]

    # Through the guards to a service that is not there: unreachable, as JSON.
    status, reply = await fetch(interrupt, body=asked, headers=guard)
    assert status == 502 and "cannot reach agent service" in json.loads(reply)["error"]
    status, reply = await fetch(page_url + "api/sessions?limit=x")
    assert status == 400 and json.loads(reply)["error"].startswith("bad query")
