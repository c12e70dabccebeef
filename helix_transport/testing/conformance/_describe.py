"""The checks of the service itself: grpc.health.v1 and ``Describe``."""

from __future__ import annotations

import json

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import AGENT_TYPE, Failed, require
from helix_transport.testing.conformance._kit import Kit


async def check_health(kit: Kit) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(kit.channel)
    for service in ("", pb.DESCRIPTOR.services_by_name["AgentService"].full_name):
        reply = await stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=kit.rpc_timeout_s
        )
        require(
            reply.status == health_pb2.HealthCheckResponse.SERVING,
            f"grpc.health.v1 Check({service!r}) is "
            f"{health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}, not SERVING",
        )
    return "grpc.health.v1: SERVING"


async def check_describe(kit: Kit) -> str:
    """``Describe``: a valid agent type and two JSON Schema objects, and the optional
    capabilities it implements (all kept for later checks)."""
    described = await kit.stub.Describe(pb.DescribeRequest(), timeout=kit.rpc_timeout_s)
    kit.agent_type = described.agent_type
    kit.capabilities = frozenset(described.capabilities)
    require(
        AGENT_TYPE.match(described.agent_type) is not None,
        f"agent_type {described.agent_type!r} does not match {AGENT_TYPE.pattern}",
    )
    try:
        kit.input_schema = json.loads(described.input_schema_json)
        output_schema = json.loads(described.output_schema_json)
    except ValueError as exc:
        raise Failed(f"a schema is not valid JSON: {exc}") from None
    require(
        isinstance(kit.input_schema, dict) and isinstance(output_schema, dict),
        "input_schema_json and output_schema_json must be JSON Schema objects",
    )
    # Names the kit does not know are a later contract's: listed, never judged.
    capabilities = list(described.capabilities) or "none listed"
    return (
        f"agent {described.agent_type!r}, tools {list(described.tool_names)}, "
        f"capabilities {capabilities}"
    )
