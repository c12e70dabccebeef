"""Credentials rotated while a service runs: a token file, a JWT key and TLS files,
swapped in place as Kubernetes updates a mounted Secret (a symlink ``..data`` pointing
at a new directory), picked up without a restart; a bad edit keeps the previous ones.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import AgentClient, AgentServer, ServerConfig, UsageError, create_server
from helix_transport._exceptions import HelixError, Unauthenticated
from helix_transport.config import Environment
from helix_transport.registry import address_env_var
from helix_transport.server.auth import AuthConfig
from helix_transport.store import MemoryStore
from helix_transport.testing.certs import TestCA
from helix_transport.transport._auth import ClientAuth
from tests.agents import counter, delegator
from tests.helpers import assert_eventually
from tests.security.conftest import JwtKeys, Pki

FAST = 0.05  # seconds between checks of the files


class SecretVolume:
    """A directory laid out as Kubernetes mounts a Secret: each file is a symlink through
    ``..data``, which an update points at a new directory in one rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0

    def path(self, name: str) -> str:
        return str(self.root / name)

    def write(self, **files: bytes) -> None:
        self.version += 1
        target = self.root / f"..v{self.version}"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        staged = self.root / "..data_tmp"
        staged.symlink_to(target.name)
        os.replace(staged, self.root / "..data")


@pytest.fixture
def volume(tmp_path: Path) -> SecretVolume:
    return SecretVolume(tmp_path)


@asynccontextmanager
async def served(auth: AuthConfig) -> AsyncIterator[AgentServer]:
    async with await create_server(counter, MemoryStore(), ServerConfig(), auth=auth) as server:
        yield server


async def admitted(address: str, **auth: object) -> bool:
    """Whether a new connection with these credentials may call ``Describe``."""
    try:
        async with await AgentClient.connect(address, auth=ClientAuth(**auth)) as c:  # type: ignore[arg-type]
            await c.describe()
    except (Unauthenticated, HelixError):
        return False
    return True


def token_line(token: str, principal: str) -> bytes:
    return f"{token} {principal} acme\n".encode()


async def test_a_rotated_token_file_admits_the_new_tokens_only(volume: SecretVolume) -> None:
    old, new = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    volume.write(tokens=token_line(old, "alice"))
    async with served(AuthConfig(tokens_file=volume.path("tokens"), reload_interval_s=FAST)) as s:
        assert await admitted(s.address, token=old)
        assert not await admitted(s.address, token=new)
        volume.write(tokens=token_line(new, "alice"))

        async def rotated() -> bool:
            return await admitted(s.address, token=new)

        await assert_eventually(rotated, timeout_s=5)
        assert not await admitted(s.address, token=old)
        assert s.auth.reload is not None and s.auth.reload.reloads == 1


async def test_a_bad_edit_keeps_the_previous_tokens_until_a_good_one(
    volume: SecretVolume, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    volume.write(tokens=token_line(old, "alice"))
    config = AuthConfig(tokens_file=volume.path("tokens"), reload_interval_s=FAST)
    async with served(config) as server:
        reload = server.auth.reload
        assert reload is not None
        with caplog.at_level(logging.ERROR, logger="helix.auth"):
            volume.write(tokens=b"tooShortXY alice\n")  # a token too short to load

            async def refused() -> bool:
                return "do not load" in caplog.text

            await assert_eventually(refused, timeout_s=5)
        assert "tooShortXY" not in caplog.text  # the message names the line, never the token
        assert await admitted(server.address, token=old)  # neither locked out nor open
        assert not await admitted(server.address, token="tooShortXY")
        volume.write(tokens=token_line(new, "alice"))

        async def rotated() -> bool:
            return await admitted(server.address, token=new)

        await assert_eventually(rotated, timeout_s=5)
        assert reload.reloads == 1


async def test_a_surprise_while_loading_does_not_end_reloading(
    volume: SecretVolume, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new, newer = (secrets.token_urlsafe(24) for _ in range(3))
    volume.write(tokens=token_line(old, "alice"))
    async with served(AuthConfig(tokens_file=volume.path("tokens"), reload_interval_s=FAST)) as s:
        reload = s.auth.reload
        assert reload is not None
        surprises: list[str] = []

        def surprise() -> None:
            surprises.append("raised")
            raise RuntimeError("not a UsageError")

        with monkeypatch.context() as patch:
            patch.setattr(reload, "_load", surprise)
            volume.write(tokens=token_line(new, "alice"))

            async def raised() -> bool:
                return bool(surprises)

            await assert_eventually(raised, timeout_s=5)
        volume.write(tokens=token_line(newer, "alice"))

        async def rotated() -> bool:
            return await admitted(s.address, token=newer)

        await assert_eventually(rotated, timeout_s=5)


async def test_a_rotated_jwt_key_verifies_the_new_signer_only(
    volume: SecretVolume, jwt_keys: JwtKeys
) -> None:
    volume.write(**{"jwt.pub": jwt_keys.rsa_public_file.read_bytes()})
    config = AuthConfig(
        jwt_key_file=volume.path("jwt.pub"), jwt_audience="helix-mesh-test", reload_interval_s=FAST
    )
    old, new = jwt_keys.token(), jwt_keys.token(jwt_keys.ec_private, algorithm="ES256")
    async with served(config) as server:
        assert await admitted(server.address, token=old)
        assert not await admitted(server.address, token=new)
        volume.write(**{"jwt.pub": jwt_keys.ec_public_file.read_bytes()})

        async def rotated() -> bool:
            return await admitted(server.address, token=new)

        await assert_eventually(rotated, timeout_s=5)
        assert not await admitted(server.address, token=old)


def tls_volume(volume: SecretVolume, pki: Pki, token: str) -> AuthConfig:
    """A token file and the test CA's server certificate in ``volume``, reloaded fast."""
    volume.write(
        tokens=token_line(token, "alice"),
        **{"tls.crt": pki.server_cert.read_bytes(), "tls.key": pki.server_key.read_bytes()},
    )
    return AuthConfig(
        tokens_file=volume.path("tokens"),
        tls_cert_file=volume.path("tls.crt"),
        tls_key_file=volume.path("tls.key"),
        reload_interval_s=FAST,
    )


async def test_rotated_tls_files_serve_new_handshakes(volume: SecretVolume, pki: Pki) -> None:
    token = secrets.token_urlsafe(24)
    next_ca = TestCA("the next CA")
    following = next_ca.issue("helix-server", server=True)
    config = tls_volume(volume, pki, token)
    async with served(config) as server:
        address = f"localhost:{server.port}"
        assert await admitted(address, token=token, tls_ca=pki.ca.read_bytes())
        assert not await admitted(address, token=token, tls_ca=next_ca.cert_pem)
        volume.write(
            tokens=token_line(token, "alice"),
            **{"tls.crt": following.cert_pem, "tls.key": following.key_pem},
        )

        async def rotated() -> bool:
            return await admitted(address, token=token, tls_ca=next_ca.cert_pem)

        await assert_eventually(rotated, timeout_s=10)
        assert not await admitted(address, token=token, tls_ca=pki.ca.read_bytes())


async def test_a_key_that_is_not_the_certificates_keeps_the_previous_pair(
    volume: SecretVolume, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    # Rotating by hand, one file lands before the other: grpc would fail every handshake.
    token = secrets.token_urlsafe(24)
    following = TestCA("the next CA").issue("helix-server", server=True)
    config = tls_volume(volume, pki, token)
    async with served(config) as server:
        address = f"localhost:{server.port}"
        with caplog.at_level(logging.ERROR, logger="helix.auth"):
            volume.write(
                tokens=token_line(token, "alice"),
                **{"tls.crt": following.cert_pem, "tls.key": pki.server_key.read_bytes()},
            )

            async def refused() -> bool:
                return "is not the key of" in caplog.text

            await assert_eventually(refused, timeout_s=5)
        assert await admitted(address, token=token, tls_ca=pki.ca.read_bytes())
    with pytest.raises(UsageError, match="is not the key of"):
        config.load()  # and at start, a clear error instead of failing handshakes


async def test_a_rotated_client_token_reaches_the_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent presents its own token (--client-token-file) to the counter service.
    # The counter service moves to a new token; once the parent's file holds it too,
    # the parent's later delegations present it, without a restart of either.
    user, old, new = (secrets.token_urlsafe(24) for _ in range(3))
    child_secret, parent_secret = SecretVolume(tmp_path / "c"), SecretVolume(tmp_path / "p")
    for volume in (child_secret, parent_secret):
        volume.root.mkdir()
    child_secret.write(tokens=token_line(old, "mesh"))
    parent_secret.write(**{"client-token": old.encode()})
    users = tmp_path / "users"
    users.write_bytes(token_line(user, "alice"))
    child_auth = AuthConfig(tokens_file=child_secret.path("tokens"), reload_interval_s=FAST)
    parent_auth = AuthConfig(tokens_file=str(users), reload_interval_s=FAST)
    client_auth = ClientAuth.from_files(token_file=parent_secret.path("client-token"))
    calls = json.dumps({"calls": [{"tool": "count", "args": {"steps": 1, "words": 1}}]})
    async with (
        await create_server(counter, MemoryStore(), auth=child_auth) as child,
        await create_server(
            delegator, MemoryStore(), auth=parent_auth, client_auth=client_auth
        ) as parent,
        await AgentClient.connect(parent.address, auth=ClientAuth(token=user)) as c,
    ):
        monkeypatch.setenv(address_env_var(counter.name), child.address)

        async def delegated() -> bool:
            started = await c.start(calls)
            output = json.loads((await c.wait(started.session_id)).output_json)
            return "error" not in output["results"][0]

        assert await delegated()
        child_secret.write(tokens=token_line(new, "mesh"))

        async def old_refused() -> bool:
            return not await admitted(child.address, token=old)

        await assert_eventually(old_refused, timeout_s=5)
        assert not await delegated()  # the parent still presents the old token
        parent_secret.write(**{"client-token": new.encode()})
        await assert_eventually(delegated, timeout_s=10)
        reload = parent._client_reload
        assert reload is not None and reload.reloads == 1 and reload.auth.token == new


async def test_reloading_off_reads_the_files_at_start_only(volume: SecretVolume) -> None:
    old, new = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    volume.write(tokens=token_line(old, "alice"))
    async with served(AuthConfig(tokens_file=volume.path("tokens"), reload_interval_s=0)) as s:
        assert s.auth.reload is None
        volume.write(tokens=token_line(new, "alice"))
        assert await admitted(s.address, token=old)
        assert not await admitted(s.address, token=new)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_reload_interval_is_refused_by_name(value: str) -> None:
    with pytest.raises(UsageError, match="HELIX_AUTH_RELOAD_INTERVAL_S"):
        env = Environment({"HELIX_AUTH_RELOAD_INTERVAL_S": value})
        AuthConfig(**(env.server_auth() | {"tokens_file": "t"})).check()


def test_the_reload_interval_comes_from_the_environment() -> None:
    config = AuthConfig(**Environment({"HELIX_AUTH_RELOAD_INTERVAL_S": "2.5"}).server_auth())
    assert config.reload_interval_s == 2.5
    assert (
        AuthConfig(**Environment({}).server_auth()).reload_interval_s
        == AuthConfig().reload_interval_s
    )
