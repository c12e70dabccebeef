"""The mesh registry: where the service for an agent type listens.

Looked up, in order, in the environment (``HELIX_AGENT_ADDRESS_<TYPE>``, the type
upper-cased with ``-`` as ``_``, e.g. ``HELIX_AGENT_ADDRESS_RESEARCHER=127.0.0.1:50061``)
and in a JSON registry file named by ``HELIX_REGISTRY_FILE``
(``{"researcher": "dns:///researcher-headless.helix.svc:50051"}``). On Kubernetes
the same variables point at headless Services. An entry ``a2a:http://host:port`` names
an A2A agent (``helix_transport.a2a.child.a2a_agent_tool``).
"""

from __future__ import annotations

import json
from pathlib import Path

from helix_transport._exceptions import UsageError
from helix_transport.config import Environment, address_variable

REGISTRY_FILE_ENV = "HELIX_REGISTRY_FILE"


address_env_var = address_variable
"""``HELIX_AGENT_ADDRESS_RESEARCHER`` for ``researcher`` (``config.address_variable``)."""


def resolve_address(agent_type: str) -> str:
    """The address of the service for ``agent_type``.

    Raises:
        UsageError: no address is configured (the message says how to configure one).
    """
    env_var = address_env_var(agent_type)
    env = Environment()
    address = env.agent_address(agent_type)
    if address:
        return address
    path = env.registry_file()
    if path:
        try:
            entries = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"cannot read registry file {path} ({REGISTRY_FILE_ENV}): {exc}"
            ) from exc
        address = str(entries.get(agent_type, "")).strip() if isinstance(entries, dict) else ""
        if address:
            return address
    raise UsageError(
        f"no address for agent type {agent_type!r}: set {env_var}=host:port "
        f"or list it in the JSON file named by {REGISTRY_FILE_ENV}"
    )
