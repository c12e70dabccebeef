"""The manifests' connection age: on for every agent type, with a grace for long streams.

Parents reach pods an autoscaler adds only once their connections age out (GOAWAY, then
the headless Service is resolved again), so the age must be on and short enough to
matter next to a scale-up; the grace must leave long streams alone for a while.
"""

from __future__ import annotations

import pytest

from helix_transport import ConnectionAge
from helix_transport.config import Environment
from tests.deploy.test_manifests import (
    ALL,
    agent_container,
    agent_deployments,
    effective_env,
    rendered,
    serve_args,
)


@pytest.mark.parametrize("which", ALL)
def test_every_agent_ages_its_connections(which: str) -> None:
    objects = rendered(which)
    for deployment in agent_deployments(objects):
        container = agent_container(deployment)
        args = serve_args(container, objects)
        env = Environment(effective_env(container, objects))
        age = env.connection_age(
            max_age_s=args.max_connection_age, grace_s=args.max_connection_age_grace
        )
        name = deployment["metadata"]["name"]
        # On, and at most the library's default: a scale-up is felt within minutes.
        assert 0 < age.max_age_s <= ConnectionAge.default.max_age_s, name
        # The grace outlasts the age: a stream in flight is seldom cut (and then resumes).
        assert age.grace_s >= age.max_age_s, name
