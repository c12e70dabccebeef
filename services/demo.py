"""`make demo` (python -m services.demo): a small mesh on loopback, and one delegation streamed as a live tree.

Starts the researcher, summarizer, mailer and orchestrator services as four processes
on free 127.0.0.1 ports, each with its own SQLite store, points the orchestrator at
the others through the mesh registry (HELIX_AGENT_ADDRESS_<TYPE>), asks it one
question, to be emailed too, and prints every event as it arrives: the
orchestrator's own, and its children's, indented under it. Offline it runs on the
scripted model; set HELIX_MODEL (e.g. openai/gpt-4o-mini) and the provider's key for
a real one.

The email needs a person's approval: the mailer's request travels up to the root's
stream, the mailer and then the orchestrator suspend, and the answer goes to the
root's service, which passes it down to the mailer. On a terminal the demo asks you;
without one it approves by itself, and says so. The sent email lands in the mailer's
outbox file (HELIX_MAILER_OUTBOX), whose line the demo prints.

The services inherit the environment, tracing included (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``LANGFUSE_*``), and are stopped with SIGTERM, so each flushes its spans on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from helix_transport import AgentClient
from helix_transport.cli import EventPrinter
from helix_transport.cli.answer import RequestWatch
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from services.mailer.agent import OUTBOX_ENV

ROOT = Path(__file__).resolve().parent.parent

QUESTION = "How does a gRPC agent mesh resume a stream and why does it keep an event log?"
EMAIL_TO = "team@example.com"
"""Where the demo has the answer emailed (to the mailer's outbox file, not the internet)."""


def mesh(workdir: Path, env: dict[str, str]) -> dict[str, ServiceProcess]:
    """The demo's four services (not yet started), on free ports, each with its own
    SQLite store in ``workdir``; the orchestrator finds the others through the registry,
    and the mailer writes to ``workdir/outbox.jsonl``."""
    services = {
        name: ServiceProcess(
            f"services.{name}:agent",
            port=free_port(),
            store_url=f"sqlite:///{workdir / (name + '.db')}",
            log_path=workdir / f"{name}.log",
            env=env,
            cwd=ROOT,
        )
        for name in ("researcher", "summarizer", "mailer", "orchestrator")
    }
    services["mailer"].env[OUTBOX_ENV] = str(outbox(workdir))
    for name in ("researcher", "summarizer", "mailer"):
        services["orchestrator"].env[address_env_var(name)] = services[name].address
    return services


def outbox(workdir: Path) -> Path:
    """The file the demo's mailer "sends" to: one JSON line per email."""
    return workdir / "outbox.jsonl"


async def main(question: str) -> int:
    model = os.environ.get("HELIX_MODEL") or "the scripted model (offline)"
    print(f"helix-mesh demo: four agent services on 127.0.0.1, using {model}\n")
    with tempfile.TemporaryDirectory(prefix="helix-demo-") as tmp:
        workdir = Path(tmp)
        # A small per-chunk delay makes the offline stream visibly live.
        env = {"HELIX_SCRIPTED_DELAY_MS": os.environ.get("HELIX_SCRIPTED_DELAY_MS", "15"),
               "HELIX_LOG_LEVEL": "WARNING"}  # fmt: skip
        services = mesh(workdir, env)
        started = time.perf_counter()
        try:
            await asyncio.gather(*(s.start() for s in services.values()))
            for name, service in services.items():
                print(f"  {name:<13} serving on {service.address}")
            print(f"  (started in {time.perf_counter() - started:.1f}s)\n")
            outcome = await _ask(services["orchestrator"].address, question)
            sent = outbox(workdir)
            for line in sent.read_text().splitlines() if sent.exists() else ["(empty)"]:
                print(f"mailer's outbox: {line}")
            return outcome
        except Exception:
            for service in services.values():
                if service.log_path.exists():
                    print(f"--- {service.agent} log ---\n{service.log_path.read_text()[-2000:]}")
            raise
        finally:
            codes = await asyncio.gather(*(s.stop() for s in services.values()))
            for name, code in zip(services, codes, strict=True):
                if code not in (0, None):  # killed after its grace: its last spans are lost
                    print(f"  {name} did not stop cleanly (exit code {code})")


async def _ask(address: str, question: str) -> int:
    print(f"question: {question}\n(the answer is to be emailed to {EMAIL_TO})\n")
    async with await AgentClient.connect(address) as client:
        started = await client.start(json.dumps({"question": question, "email_to": EMAIL_TO}))
        printer = EventPrinter()
        # The mailer's request for approval reaches this, the root's, stream: on a
        # terminal ask the person there, else approve it and say so.
        terminal = sys.stdin.isatty()
        watch = RequestWatch(
            client, started.session_id, mode="ask" if terminal else "auto", auto_label="no terminal"
        )
        last = None
        async for event in client.stream(started.session_id):
            printer.print(event)  # an input_required ends any open line of text
            await watch.add(event)
            last = event
        printer.close()
        tree = watch.tree  # the whole tree's usage, folded from the root's log alone
        status = await client.get_status(started.session_id)
    if last is None or last.WhichOneof("payload") != "completed":
        print(f"\nthe session did not complete: {status.error or last}")
        return 1
    output = json.loads(last.completed.output_json)
    print("\nanswer:", output["answer"])
    print("findings:")
    for finding in output["findings"]:
        print("  -", finding)
    print("email:", output.get("email") or "-")
    assert tree.root is not None
    sessions = list(tree.root.walk())
    total = tree.root.total_usage
    print(
        f"\nsession {started.session_id}: {status.last_sequence} events, "
        f"{status.step_count} steps, {len(sessions)} sessions in its tree, "
        f"{total.total_tokens} tokens in all ({total.prompt_tokens} prompt, "
        f"{total.completion_tokens} completion; the orchestrator's own: "
        f"{tree.root.usage.total_tokens})"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--question", default=QUESTION)
    raise SystemExit(asyncio.run(main(parser.parse_args().question)))
