"""The Agent Card of a helix service, from its ``Describe``."""

from __future__ import annotations

import json

from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import PROTOCOL_VERSION_1_0, TransportProtocol

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a import mapping

SCHEMA_EXTENSION = "urn:helix-mesh:a2a:schemas:v1"
"""The card extension whose params hold each skill's input and output JSON Schema
(A2A's skill has no schema field of its own)."""
BEARER_SCHEME = "bearer"
"""The name of the card's security scheme when the service authenticates callers."""
JSONRPC_PATH = "/"
REST_PATH = "/rest"
"""Where the HTTP+JSON binding is mounted (JSON-RPC answers at the root)."""


def agent_card(
    describe: pb.DescribeResponse,
    *,
    base_url: str,
    authenticates: bool,
    version: str = "1.0.0",
) -> a2a.AgentCard:
    """The card of the agent ``describe`` names, served at ``base_url``.

    One skill (the agent), streaming, no push notifications; with ``authenticates``
    an HTTP bearer scheme (a token of the service's token file, or a JWT) required
    for every call, as the gRPC service requires it.
    """
    base = base_url.rstrip("/")
    card = a2a.AgentCard(
        name=describe.agent_type,
        description=describe.description or describe.agent_type,
        version=version,
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
    )
    for binding, path in (
        (TransportProtocol.JSONRPC, JSONRPC_PATH),
        (TransportProtocol.HTTP_JSON, REST_PATH),
    ):
        card.supported_interfaces.add(
            url=base + path, protocol_binding=binding.value, protocol_version=PROTOCOL_VERSION_1_0
        )
    card.capabilities.streaming = True
    card.capabilities.push_notifications = False
    extension = card.capabilities.extensions.add(
        uri=SCHEMA_EXTENSION,
        description="input and output JSON Schema of each skill (the helix agent's own)",
    )
    extension.params.update(
        {
            describe.agent_type: {
                "input_schema": json.loads(describe.input_schema_json or "{}"),
                "output_schema": json.loads(describe.output_schema_json or "{}"),
            }
        }
    )
    skill = card.skills.add(
        id=describe.agent_type,
        name=describe.agent_type,
        description=describe.description or describe.agent_type,
        tags=["helix-mesh", *describe.capabilities],
        input_modes=["application/json", "text/plain"],
        output_modes=["application/json"],
    )
    del skill  # filled in place
    if authenticates:
        scheme = card.security_schemes[BEARER_SCHEME]
        scheme.http_auth_security_scheme.scheme = "Bearer"
        scheme.http_auth_security_scheme.description = (
            "the service's own credentials: a token of its token file, or a JWT it trusts"
        )
        requirement = card.security_requirements.add()
        requirement.schemes[BEARER_SCHEME].SetInParent()
    card.capabilities.extensions.add(
        uri="urn:helix-mesh:a2a:events:v1",
        description=(
            f"every stream event carries metadata.{mapping.METADATA_KEY}.sequence, its "
            "position in the session's durable log (resume without loss or repeat)"
        ),
    )
    return card
