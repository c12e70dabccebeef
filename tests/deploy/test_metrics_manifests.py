"""The manifests' metrics: every agent pod serves /metrics on a named port Prometheus is
told about, the prod autoscalers scale on the running sessions the code exports (CPU
kept as the fallback), and the optional metrics-adapter component renders into prod
with what that metric needs (a PodMonitor, the scrape's NetworkPolicy, the adapter's
rule), all checked against the code and, where they are core kinds, validated strictly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from helix_transport._config import Limits
from helix_transport.config import Environment
from helix_transport.metrics import MetricsConfig, start_metrics
from tests.deploy.test_manifests import (
    AGENT_LABELS,
    ALL,
    EXTERNAL_RENDERER,
    K8S,
    NAMESPACE,
    agent_container,
    agent_deployments,
    effective_env,
    find,
    render_external,
    rendered,
    scrape,
)

COMPONENT = K8S / "components" / "metrics-adapter"
RUNNING = "helix_sessions_running"
"""The autoscaling metric, as Prometheus names the gauge ``helix.sessions.running``."""

pytestmark = pytest.mark.timeout(300)


def metrics_port(container: dict[str, Any]) -> int:
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert port["protocol"] == "TCP"
    return int(port["containerPort"])


@pytest.mark.parametrize("which", ALL)
def test_every_agent_pod_serves_metrics_where_prometheus_looks(which: str) -> None:
    objects = rendered(which)
    deployments = agent_deployments(objects)
    assert deployments
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        container = agent_container(deployment)
        port = metrics_port(container)
        grpc = [p["containerPort"] for p in container["ports"] if p["name"] == "grpc"]
        assert port not in grpc, name
        # What `serve` reads: the same port the pod declares and the annotations name.
        env = effective_env(container, objects)
        assert Environment(env).metrics_port() == port, (
            f"{name}: HELIX_METRICS_PORT is not the metrics port"
        )
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] == "/metrics"


@pytest.fixture(scope="module")
def exported() -> Iterator[str]:
    """What a process with metrics on serves (no server yet: the metric names)."""
    import asyncio

    endpoint = start_metrics(MetricsConfig(port=0))
    try:
        yield asyncio.run(scrape(endpoint.url))
    finally:
        endpoint.shutdown()


def test_prod_scales_on_running_sessions_per_pod_with_cpu_as_fallback(exported: str) -> None:
    assert f"# TYPE {RUNNING} gauge" in exported  # the name the code exports
    objects = rendered("prod")
    for deployment in agent_deployments(objects):
        name = deployment["metadata"]["name"]
        hpa = find(objects, "HorizontalPodAutoscaler", name)["spec"]
        kinds = [m["type"] for m in hpa["metrics"]]
        assert sorted(kinds) == ["Pods", "Resource"], name
        (pods,) = [m["pods"] for m in hpa["metrics"] if m["type"] == "Pods"]
        assert pods["metric"]["name"] == RUNNING
        assert "selector" not in pods["metric"]  # per pod, every pod of the Deployment
        target = pods["target"]
        assert target["type"] == "AverageValue"
        # Reachable: below what one replica may run before it refuses Starts.
        assert 0 < float(target["averageValue"]) < Limits.default.max_running_sessions
        (cpu,) = [m["resource"] for m in hpa["metrics"] if m["type"] == "Resource"]
        assert cpu["name"] == "cpu" and cpu["target"]["type"] == "Utilization"


def _with_component(tmp_path: Path) -> list[dict[str, Any]]:
    """prod with the component added, as an operator would (kustomize when installed;
    else prod as rendered plus the component's resources, which are all it holds)."""
    spec = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert spec["kind"] == "Component" and set(spec) == {"apiVersion", "kind", "resources"}
    if EXTERNAL_RENDERER is None:
        objects = rendered("prod")
        for entry in spec["resources"]:
            for doc in yaml.safe_load_all((COMPONENT / entry).read_text()):
                doc["metadata"]["namespace"] = NAMESPACE
                objects.append(doc)
        return objects
    relative = Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": NAMESPACE,
                "resources": [str(relative / "overlays" / "prod")],
                "components": [str(relative / "components" / "metrics-adapter")],
            }
        )
    )
    return render_external(tmp_path)


def test_the_metrics_adapter_component_renders_into_prod(tmp_path: Path) -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    objects = _with_component(tmp_path)
    prod = rendered("prod")
    assert len(objects) == len(prod) + 2
    deployments = agent_deployments(objects)

    monitor = find(objects, "PodMonitor", "helix-agents")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["spec"]["selector"]["matchLabels"] == AGENT_LABELS
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    for deployment in deployments:  # the named port exists on every pod it selects
        assert any(p["name"] == endpoint["port"] for p in agent_container(deployment)["ports"])

    policy = find(objects, "NetworkPolicy", "helix-agents-metrics")
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == AGENT_LABELS
    (rule,) = policy["spec"]["ingress"]
    ports = {metrics_port(agent_container(d)) for d in deployments}
    assert rule["ports"] == [{"protocol": "TCP", "port": port} for port in ports]
    for peer in rule["from"]:  # a namespace, never everyone
        assert set(peer) == {"namespaceSelector"} and peer["namespaceSelector"]["matchLabels"]


def test_the_adapter_rule_serves_the_metric_the_autoscalers_ask_for() -> None:
    values = yaml.safe_load((COMPONENT / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["seriesQuery"].startswith(f"{RUNNING}{{")
    assert rule["name"]["as"] == RUNNING
    # Mapped back to pods: the HPA's Pods metric is looked up per pod and namespace.
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
