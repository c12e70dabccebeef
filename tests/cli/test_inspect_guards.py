"""The ``helix-mesh inspect`` process (a real one) guards the credentials it calls with:
only requests addressed to 127.0.0.1 or localhost, an interrupt or an answer only with
the page's header, and any call only toward a service it knows (the inspected one, one
a tree named, one the registry names); errors are JSON a page can show."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import pytest

from helix_transport.registry import address_env_var
from helix_transport.testing.processes import free_port
from tests.helpers import ROOT

REGISTERED = f"127.0.0.1:{free_port()}"
"""Where the inspect process's registry says the ``mailer`` agent type is served."""


@pytest.fixture
async def page_url() -> AsyncIterator[str]:
    """``helix-mesh inspect`` of a service that is not there."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "inspect", f"127.0.0.1:{free_port()}",
        "--port", "0", "--session", "s/1",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, address_env_var("mailer"): REGISTERED},
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
    for module in ("app.js", "dom.js", "sessions.js", "answers.js"):
        status, script = await fetch(page_url + "static/" + module)
        assert status == 200 and b"innerHTML" not in script, module
        assert b"textContent" in script, module

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


async def test_an_answer_passes_the_same_guards_as_an_interrupt(page_url: str) -> None:
    answer = page_url + "api/answer"
    approve: dict[str, object] = {
        "session_id": "s1",
        "request_id": "call_1",
        "path": ["s1"],
        "approved": True,
    }
    asked = json.dumps(approve).encode()
    guard = {"X-Helix-Inspect": "1", "Content-Type": "application/json"}

    status, _ = await fetch(answer, body=asked, headers={**guard, "Host": "attacker.example"})
    assert status == 400  # DNS rebinding
    status, reply = await fetch(answer, body=asked)  # a cross-site form could send this
    assert status == 403 and json.loads(reply) == {"error": "missing header X-Helix-Inspect"}
    elsewhere = json.dumps({**approve, "address": "10.1.2.3:443"}).encode()
    status, reply = await fetch(answer, body=elsewhere, headers=guard)
    assert status == 403 and "not one this page inspects" in json.loads(reply)["error"]
    status, reply = await fetch(answer, body=b"[1]", headers=guard)
    assert status == 400 and "session_id" in json.loads(reply)["error"]

    # What the answer must be, refused before any call.
    wrongs: list[tuple[dict[str, object], str]] = [
        ({"approved": True, "result_json": "1"}, "give one answer"),
        ({"approved": None}, "give one answer"),
        ({"approved": "yes"}, "approved is true or false"),
        ({"approved": None, "result_json": "{not json"}, "result_json is not JSON"),
        ({"request_id": ""}, "give request_id"),
        ({"path": "s1"}, "path is a list"),
    ]
    for wrong, said in wrongs:
        status, reply = await fetch(
            answer, body=json.dumps({**approve, **wrong}).encode(), headers=guard
        )
        assert status == 400 and said in json.loads(reply)["error"], (wrong, reply)
    # (Past the guards, SubmitInput retries an unreachable service for the client's
    # reconnect deadline, as `respond` does: an answer applies at most once.)


async def test_the_registry_names_the_services_a_page_may_follow(page_url: str) -> None:
    status, reply = await fetch(page_url + "api/services")
    inspected = json.loads(reply)["inspected"]
    assert status == 200 and json.loads(reply)["addresses"] == [inspected]

    # Not known yet: neither its sessions nor an interrupt go there.
    listed = page_url + "api/sessions?" + urlencode({"address": REGISTERED})
    status, reply = await fetch(listed)
    assert status == 403 and "not one this page inspects" in json.loads(reply)["error"]
    status, reply = await fetch(page_url + "api/resolve?agent_type=nobody")
    assert status == 404 and "HELIX_AGENT_ADDRESS_NOBODY" in json.loads(reply)["error"]

    # The registry names it: from then on the page may call it (it is down: 502).
    status, reply = await fetch(page_url + "api/resolve?agent_type=mailer")
    assert status == 200 and json.loads(reply) == {"agent_type": "mailer", "address": REGISTERED}
    status, reply = await fetch(page_url + "api/services")
    assert json.loads(reply)["addresses"] == [inspected, REGISTERED]
    status, reply = await fetch(listed)
    assert status == 502 and "cannot reach agent service" in json.loads(reply)["error"]
