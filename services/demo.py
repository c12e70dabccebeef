"""`make demo` (python -m services.demo): a small mesh on loopback, and one delegation streamed as a live tree.

Starts the researcher, summarizer and orchestrator services as three processes on
free 127.0.0.1 ports, each with its own SQLite store, points the orchestrator at
the other two through the mesh registry (HELIX_AGENT_ADDRESS_<TYPE>), asks it one
question and prints every event as it arrives: the orchestrator's own, and its
children's, indented under it. Offline it runs on the scripted model; set
HELIX_MODEL (e.g. openai/gpt-4o-mini) and the provider's key for a real one.

The services inherit the environment, tracing included (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``LANGFUSE_*``), and are stopped with SIGTERM, so each flushes its spans on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from helix_transport import AgentClient, SessionTree
from helix_transport.cli import EventPrinter
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parent.parent

QUESTION = "How does a gRPC agent mesh resume a stream and why does it keep an event log?"


def mesh(workdir: Path, env: dict[str, str]) -> dict[str, ServiceProcess]:
    """The demo's three services (not yet started), on free ports, each with its own
    SQLite store in ``workdir``; the orchestrator finds the other two through the registry."""
    services = {
        name: ServiceProcess(
            f"services.{name}:agent",
            port=free_port(),
            store_url=f"sqlite:///{workdir / (name + '.db')}",
            log_path=workdir / f"{name}.log",
            env=env,
            cwd=ROOT,
        )
        for name in ("researcher", "summarizer", "orchestrator")
    }
    for name in ("researcher", "summarizer"):
        services["orchestrator"].env[address_env_var(name)] = services[name].address
    return services


async def main(question: str) -> int:
    model = os.environ.get("HELIX_MODEL") or "the scripted model (offline)"
    print(f"helix-mesh demo: three agent services on 127.0.0.1, using {model}\n")
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
            return await _ask(services["orchestrator"].address, question)
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
    print(f"question: {question}\n")
    async with await AgentClient.connect(address) as client:
        started = await client.start(json.dumps({"question": question}))
        printer = EventPrinter()
        last = None
        tree = SessionTree()  # the whole tree's usage, folded from the root's log alone
        async for event in client.stream(started.session_id):
            printer.print(event)
            tree.add(event)
            last = event
        printer.close()
        status = await client.get_status(started.session_id)
    if last is None or last.WhichOneof("payload") != "completed":
        print(f"\nthe session did not complete: {status.error or last}")
        return 1
    output = json.loads(last.completed.output_json)
    print("\nanswer:", output["answer"])
    print("findings:")
    for finding in output["findings"]:
        print("  -", finding)
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
