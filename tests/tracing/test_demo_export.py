"""``OTEL_EXPORTER_OTLP_ENDPOINT=... make demo`` delivers the whole tree.

The demo (``python -m services.demo``, what ``make demo`` runs) as a process, its
four services exporting to a local OTLP receiver with a batch delay of ten minutes:
no span can leave on the exporter's schedule, so every span received was flushed by
a service stopping on SIGTERM (the demo used to SIGKILL them: 0 spans).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Iterator

import pytest

from helix_transport.tracing.ids import trace_id_for
from tests.helpers import ROOT
from tests.tracing.otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


async def test_the_demo_delivers_every_session_s_spans(receiver: OtlpReceiver) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("LANGFUSE_", "OTEL_", "HELIX_"))
    }
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="600000",  # only a flush on shutdown exports anything
        HELIX_SCRIPTED_DELAY_MS="0",
        HELIX_ALLOW_VOLATILE_STORE="1",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.demo",
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,  # no terminal: it approves itself
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "did not stop cleanly" not in text
    match = re.search(r"^session (\S+): ", text, re.MULTILINE)
    assert match, text
    root = match.group(1)

    spans = receiver.snapshot()
    assert {s.trace_id for s in spans} == {f"{trace_id_for(root):032x}"}
    assert {s.service_name for s in spans} == {"orchestrator", "researcher", "summarizer", "mailer"}
    ids = [s.span_id for s in spans]
    assert len(ids) == len(set(ids))
    runs = {s.attributes["helix.session_id"]: s for s in spans if s.name.startswith("invoke_agent")}
    assert runs[root].attributes["helix.status"] == "completed"
    # Every child the orchestrator delegated to has its run, ended, in the trace.
    delegations = [s for s in spans if s.name.startswith("delegate ")]
    children = {d.attributes["helix.child_session_id"] for d in delegations}
    assert len(children) >= 3 and children == set(runs) - {root}
    assert {runs[c].attributes["helix.status"] for c in children} == {"completed"}
    # And the calls between them, both ends.
    kinds = {(s.service_name, s.kind) for s in spans}
    assert ("orchestrator", "CLIENT") in kinds
    servers = {("researcher", "SERVER"), ("summarizer", "SERVER"), ("orchestrator", "SERVER")}
    assert {*servers, ("mailer", "SERVER")} <= kinds
