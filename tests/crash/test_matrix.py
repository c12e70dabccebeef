"""The crash matrix (see ``tests/crash/matrix.py``): a short version in the default run,
the full one under ``-m slow`` on every durable backend."""

from __future__ import annotations

import pytest

from tests.crash.matrix import Case, cases, kill_points, run_matrix, spread, victims


def test_kill_points_cover_the_run_end_to_end() -> None:
    assert spread(65, 4) == [1, 22, 44, 65]
    assert spread(4, 12) == [1, 2, 3, 4]
    assert spread(65, 1) == [33]
    kinds = ["run_started", "step_started", "child_event", "child_event", "child_event"]
    kinds += ["tool_end", "step_started", "tool_end", "output", "completed"]
    assert kill_points(kinds, samples=2, boundaries=False) == [1, 7]
    assert kill_points(kinds, samples=3, boundaries=False) == [1, 4, 7]
    assert kill_points(kinds, samples=3, boundaries=True) == [1, 2, 4, 6, 7]
    assert len(cases([1, 5], downs=(0, 1.5), again=(False, True))) == 2 * 2 * 2 * 3
    assert victims(3) == ("child", "middle", "parent", "parent+middle+child")
    assert str(Case("parent+child", 7, 1.5, again=True)) == "parent+child@7+1.5s twice"


@pytest.fixture
def _shared_backends(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, store_name: str
) -> None:
    # The matrix makes its own namespaces on the servers the conftest fixtures found
    # (they fail under CI=true when a server is missing).
    if store_name == "redis":
        monkeypatch.setenv("HELIX_BENCH_REDIS_URL", request.getfixturevalue("redis_url"))
    elif store_name == "postgres":
        monkeypatch.setenv("HELIX_BENCH_POSTGRES_DSN", request.getfixturevalue("postgres_dsn"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("store_name", "depth", "samples", "again"),
    [
        ("sqlite", 2, 3, False),  # the start, the children's streaming, the closing model call
        ("sqlite", 3, 1, False),  # parent -> middle -> child, mid-streaming
        ("postgres", 2, 1, False),  # a shared store over the network
        # Killed again as soon as it serves, and Redis: under -m slow (and the full matrix).
        pytest.param("sqlite", 2, 1, True, marks=pytest.mark.slow),
        pytest.param("redis", 2, 1, False, marks=pytest.mark.slow),
    ],
)
@pytest.mark.usefixtures("_shared_backends")
async def test_short_matrix_every_case_keeps_the_invariants(
    store_name: str, depth: int, samples: int, again: bool
) -> None:
    outcomes = await run_matrix(
        store_name, depth=depth, samples=samples, boundaries=False, again=(again,)
    )
    assert len(outcomes) == len(victims(depth)) * samples
    assert [(str(o.case), o.violations) for o in outcomes if o.violations] == []


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    ("store_name", "depth"), [("sqlite", 2), ("redis", 2), ("postgres", 2), ("sqlite", 3)]
)
@pytest.mark.usefixtures("_shared_backends")
async def test_full_matrix_every_case_keeps_the_invariants(store_name: str, depth: int) -> None:
    outcomes = await run_matrix(
        store_name, depth=depth, samples=6, downs=(0, 1.5), again=(False, True)
    )
    assert [(str(o.case), o.violations) for o in outcomes if o.violations] == []
