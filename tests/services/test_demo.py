"""``make demo`` offline (``python -m services.demo`` with no terminal): the four services
answer the question, and the mailer's request for approval travels up to the root's
stream, the demo approves it by itself and says so, the answer travels down, the mailer
sends once and the orchestrator completes with the email's outcome."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from tests.helpers import ROOT


async def test_the_demo_shows_the_approval_travel_and_finishes() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LANGFUSE_"))}
    env.update(HELIX_SCRIPTED_DELAY_MS="0", NO_COLOR="1")
    env.pop("HELIX_MODEL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.demo",
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "did not stop cleanly" not in text
    lines = text.splitlines()

    def first(needle: str, after: int = 0) -> int:
        found = next((i for i in range(after, len(lines)) if needle in lines[i]), None)
        assert found is not None, f"{needle!r} not after line {after}:\n{text}"
        return found

    # Up: the mailer asks (its event nested under the orchestrator's), the root's
    # stream shows the request with its path from the root.
    asked = first("? approval needed for send_email(")
    assert lines[asked].startswith("  [mailer call_")
    shown = first("input required: send_email(", asked)
    path = lines[first("  path ", shown)].removeprefix("  path ").split(" > ")
    assert len(path) == 2 and path[1].startswith(path[0] + "-remote-")
    # The demo answers by itself, and says so; the answer goes to the root's service.
    approving = first("no terminal: approving send_email by itself", shown)
    first(": approved (automatic: no terminal) (sent; session ", approving)
    first(f"the service of {path[0]}, and down the path {' > '.join(path)}", approving)
    # Down: the mailer resumes with the answer and sends; the orchestrator completes.
    answered = first("✓ call_1_0 approved: automatic: no terminal", approving)
    sent = first('← send_email: {"sent": true', answered)
    first("[orchestrator #", sent)
    assert any(line.endswith("] completed") and line.startswith("[orchestrator") for line in lines)
    assert "email: sent to team@example.com" in lines
    (outbox,) = [line for line in lines if line.startswith("mailer's outbox: ")]
    email = json.loads(outbox.removeprefix("mailer's outbox: "))
    assert email["to"] == "team@example.com" and email["session_id"] == path[1]
