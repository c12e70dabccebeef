"""Authentication on real servers on 127.0.0.1: a token file, JWTs, mutual TLS,
fail-closed start, health without credentials, reflection off.

Every credential is real: tokens in a file, JWTs signed with generated RSA/EC/HMAC
keys, certificates from a CA made in the test (``helix_transport.testing.certs``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from helix_transport import AgentClient, AgentServer, ServerConfig, UsageError, create_server
from helix_transport._exceptions import SessionNotFound, Unauthenticated
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.server.auth import AuthConfig, Presented, TokenFileAuthenticator
from helix_transport.store import MemoryStore
from helix_transport.transport._auth import ClientAuth
from tests.agents import counter
from tests.cli.run import cli
from tests.security.conftest import AUDIENCE, JwtKeys, Pki, Tokens

INPUT = json.dumps({"steps": 1, "words": 1})


@asynccontextmanager
async def served(auth: AuthConfig, **config: object) -> AsyncIterator[AgentServer]:
    server = await create_server(counter, MemoryStore(), ServerConfig(**config), auth=auth)  # type: ignore[arg-type]
    async with server:
        yield server


@asynccontextmanager
async def client(address: str, **auth: object) -> AsyncIterator[AgentClient]:
    credentials = ClientAuth(**auth) if auth else None  # type: ignore[arg-type]
    async with await AgentClient.connect(address, auth=credentials) as c:
        yield c


async def run_once(c: AgentClient) -> str:
    """Start a session, stream it to the end, read its status; its id."""
    started = await c.start(INPUT)
    events = [e async for e in c.stream(started.session_id)]
    assert events[-1].WhichOneof("payload") == "completed"
    status = await c.get_status(started.session_id)
    assert json.loads(status.output_json) == {"total": 1, "steps": 1}
    return started.session_id


# --- fail closed -------------------------------------------------------------------------


async def test_a_server_without_authentication_refuses_to_start() -> None:
    with pytest.raises(UsageError, match="refusing to start without authentication"):
        await create_server(counter, MemoryStore())
    with pytest.raises(UsageError, match="--allow-unauthenticated"):
        await create_server(counter, MemoryStore(), auth=AuthConfig())


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (AuthConfig(jwt_key_file="k"), "needs --jwt-audience"),
        (AuthConfig(tls_cert_file="c", tokens_file="t"), "go together"),
        (AuthConfig(tls_client_ca_file="ca"), "needs --tls-cert"),
        (AuthConfig(tokens_file="/nonexistent/tokens"), "No such file"),
    ],
)
async def test_incomplete_configurations_are_refused(config: AuthConfig, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        await create_server(counter, MemoryStore(), auth=config)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("short alice\n", "too short"),
        ("x" * 20 + "\n", "expected 'TOKEN PRINCIPAL"),
        ("x" * 20 + " a\n" + "x" * 20 + " b\n", "appears twice"),
        ("# only a comment\n", "no tokens"),
        # Each loaded, with a token no call could present (gRPC metadata is ASCII) or
        # that a BOM made another: refusals at call time instead of a clear start.
        ("x" * 20 + "\u00e9 alice\n", "printable ASCII"),
        ("x" * 20 + "\u00a0y alice\n", "printable ASCII"),
        ("x" * 20 + " anonymous\n", "'anonymous' is reserved"),
    ],
)
async def test_a_bad_token_file_is_refused_without_quoting_a_token(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "tokens"
    path.write_text(content)
    with pytest.raises(UsageError, match=problem) as raised:
        await create_server(counter, MemoryStore(), auth=AuthConfig(tokens_file=str(path)))
    assert "x" * 20 not in str(raised.value) and "short" not in str(raised.value).split(":")[-2]


async def test_allow_unauthenticated_warns_and_everyone_is_anonymous(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="helix.auth"):
        async with (
            served(AuthConfig(allow_unauthenticated=True)) as server,
            client(server.address) as c,
        ):
            await run_once(c)
    assert "authentication is OFF" in caplog.text


# --- token file --------------------------------------------------------------------------


async def test_a_token_file_written_with_a_bom_works(tmp_path: Path) -> None:
    # Notepad's UTF-8 starts with a BOM, which stuck to the first token.
    path = tmp_path / "tokens"
    path.write_bytes("\ufeff".encode() + b"t" * 20 + b" alice acme\n")
    async with (
        served(AuthConfig(tokens_file=str(path))) as server,
        client(server.address, token="t" * 20) as c,
    ):
        await run_once(c)


async def test_principals_whose_names_join_alike_have_their_own_rate(tmp_path: Path) -> None:
    # Buckets were keyed "tenant/name": 'y/z' of tenant 'x' and 'z' of tenant 'x/y'
    # (URI and e-mail names hold '/') shared one, so one could spend the other's rate.
    from helix_transport.server.limits import Limits

    path = tmp_path / "tokens"
    path.write_text("a" * 20 + " y/z x\n" + "b" * 20 + " z x/y\n")
    async with (
        served(
            AuthConfig(tokens_file=str(path)), limits=Limits(rate_per_s=0.01, rate_burst=2)
        ) as server,
        client(server.address, token="a" * 20) as attacker,
        client(server.address, token="b" * 20) as victim,
    ):
        await attacker.describe()
        await attacker.describe()
        assert (await victim.describe()).agent_type == "counter"


async def test_a_jwt_naming_anonymous_is_refused(jwt_keys: JwtKeys) -> None:
    # 'anonymous' owns every session of a service run without authentication (and those
    # from before owners): on a store shared with one, such a JWT would own them.
    async with (
        served(_jwt_config(jwt_keys.rsa_public_file)) as server,
        client(server.address, token=jwt_keys.token(sub="anonymous")) as c,
    ):
        with pytest.raises(Unauthenticated, match="'anonymous' is reserved"):
            await c.describe()


async def test_token_file_admits_listed_tokens_only(tokens: Tokens) -> None:
    async with served(AuthConfig(tokens_file=str(tokens.path))) as server:
        async with client(server.address, token=tokens.alice) as alice:
            session_id = await run_once(alice)
            assert (await alice.describe()).agent_type == "counter"
        async with client(server.address) as anonymous:
            with pytest.raises(Unauthenticated, match="missing credentials"):
                await anonymous.start(INPUT)
            with pytest.raises(Unauthenticated):
                await anonymous.get_status(session_id)
            with pytest.raises(Unauthenticated):
                await anonymous.interrupt(session_id)
            with pytest.raises(Unauthenticated):
                await anonymous.describe()
            with pytest.raises(Unauthenticated):
                [e async for e in anonymous.stream(session_id)]
        wrong = tokens.alice[:-1] + ("A" if tokens.alice[-1] != "A" else "B")
        async with client(server.address, token=wrong) as forger:
            with pytest.raises(Unauthenticated, match="invalid bearer token") as raised:
                await forger.get_status(session_id)
            assert wrong not in str(raised.value)


async def test_a_malformed_authorization_header_is_refused(tokens: Tokens) -> None:
    async with (
        served(AuthConfig(tokens_file=str(tokens.path))) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest())  # health needs nothing
        agent = pb_grpc.AgentServiceStub(channel)
        for header in (f"Basic {tokens.alice}", tokens.alice, "Bearer", "Bearer "):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await agent.Describe(pb.DescribeRequest(), metadata=(("authorization", header),))
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert tokens.alice not in (raised.value.details() or "")
        reply = await agent.Describe(
            pb.DescribeRequest(), metadata=(("authorization", f"bearer {tokens.alice}"),)
        )
        assert reply.agent_type == "counter"


async def test_health_is_reachable_without_credentials_and_reflection_can_be_off(
    tokens: Tokens,
) -> None:
    for reflection in (True, False):
        async with (
            served(AuthConfig(tokens_file=str(tokens.path)), reflection=reflection) as server,
            grpc.aio.insecure_channel(server.address) as channel,
        ):
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "helix.agent.v1.AgentService"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def list_services(
                token: str | None, stub: reflection_pb2_grpc.ServerReflectionStub = stub
            ) -> list[str]:
                metadata = (("authorization", f"Bearer {token}"),) if token else None
                call = stub.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                    metadata=metadata,
                )
                return [s.name async for r in call for s in r.list_services_response.service]

            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await list_services(None)
            expected = (
                grpc.StatusCode.UNAUTHENTICATED if reflection else grpc.StatusCode.UNIMPLEMENTED
            )
            assert raised.value.code() == expected
            if reflection:
                assert "helix.agent.v1.AgentService" in await list_services(tokens.alice)
            else:
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await list_services(tokens.alice)
                assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- JWT ---------------------------------------------------------------------------------


def _jwt_config(key_file: Path, *, jwt_issuer: str = "") -> AuthConfig:
    return AuthConfig(jwt_key_file=str(key_file), jwt_audience=AUDIENCE, jwt_issuer=jwt_issuer)


async def test_jwt_good_expired_wrong_audience_wrong_key(jwt_keys: JwtKeys) -> None:
    async with served(
        _jwt_config(jwt_keys.rsa_public_file, jwt_issuer="https://issuer.test")
    ) as server:
        good = jwt_keys.token(iss="https://issuer.test", tenant="acme")
        async with client(server.address, token=good) as c:
            await run_once(c)
        cases = {
            "JWT expired": jwt_keys.token(iss="https://issuer.test", exp=1_000_000, iat=999_000),
            "JWT audience not accepted": jwt_keys.token(
                iss="https://issuer.test", aud="another-service"
            ),
            "JWT signature does not verify": jwt_keys.token(
                jwt_keys.other_rsa_private, iss="https://issuer.test"
            ),
            "JWT issuer not accepted": jwt_keys.token(iss="https://evil.test"),
            "JWT lacks the 'iss' claim": jwt_keys.token(),
            "JWT lacks the 'exp' claim": jwt_keys.token(iss="https://issuer.test", exp=None),
            "JWT lacks the 'sub' claim": jwt_keys.token(iss="https://issuer.test", sub=None),
            # An HS256 token signed with the RSA *public* key (the classic confusion attack).
            "JWT algorithm not accepted": jwt.encode(
                {"sub": "mallory", "aud": AUDIENCE, "iss": "https://issuer.test", "exp": 2**33},
                jwt_keys.hmac_secret,
                algorithm="HS256",
            ),
            # alg "none": unsigned ("" is PyJWT's typed spelling of no key, same as None).
            "JWT algorithm not accepted ": jwt.encode(
                {"sub": "mallory", "aud": AUDIENCE, "iss": "https://issuer.test", "exp": 2**33},
                "",
                algorithm="none",
            ),
        }
        for message, token in cases.items():
            async with client(server.address, token=token) as c:
                with pytest.raises(Unauthenticated) as raised:
                    await c.describe()
                assert message.strip() in str(raised.value), message
                assert token not in str(raised.value)


@pytest.mark.parametrize("kind", ["ec", "hmac"])
async def test_jwt_with_ec_and_hmac_keys(jwt_keys: JwtKeys, kind: str) -> None:
    key_file, key, algorithm = (
        (jwt_keys.ec_public_file, jwt_keys.ec_private, "ES256")
        if kind == "ec"
        else (jwt_keys.hmac_file, jwt_keys.hmac_secret, "HS256")
    )
    async with served(_jwt_config(key_file)) as server:
        async with client(server.address, token=jwt_keys.token(key, algorithm=algorithm)) as c:
            await run_once(c)
        async with client(server.address, token=jwt_keys.token()) as c:  # RS256: wrong key type
            with pytest.raises(Unauthenticated, match="JWT algorithm not accepted"):
                await c.describe()


async def test_token_file_and_jwt_together(tokens: Tokens, jwt_keys: JwtKeys) -> None:
    config = AuthConfig(
        tokens_file=str(tokens.path),
        jwt_key_file=str(jwt_keys.rsa_public_file),
        jwt_audience=AUDIENCE,
    )
    async with served(config) as server:
        for token in (tokens.carol, jwt_keys.token()):
            async with client(server.address, token=token) as c:
                assert (await c.describe()).agent_type == "counter"
        async with client(server.address, token="x" * 40) as c:
            with pytest.raises(Unauthenticated, match="invalid bearer token"):
                await c.describe()


# --- mutual TLS --------------------------------------------------------------------------


def _mtls_config(pki: Pki, *, tokens_file: str = "") -> AuthConfig:
    return AuthConfig(
        tls_cert_file=str(pki.server_cert),
        tls_key_file=str(pki.server_key),
        tls_client_ca_file=str(pki.ca),
        tokens_file=tokens_file,
    )


def _cert(pki: Pki, which: tuple[Path, Path]) -> dict[str, object]:
    cert, key = which
    return {
        "tls_ca": pki.ca.read_bytes(),
        "tls_cert": cert.read_bytes(),
        "tls_key": key.read_bytes(),
    }


async def test_mtls_admits_certificates_of_the_ca_only(pki: Pki) -> None:
    async with served(_mtls_config(pki), health_port=0) as server:
        address = f"localhost:{server.port}"
        async with client(address, **_cert(pki, pki.client_a)) as a:
            await run_once(a)
        for credentials in (
            {"tls_ca": pki.ca.read_bytes()},  # TLS, but no client certificate
            _cert(pki, pki.stranger),  # a certificate from another CA
        ):
            async with client(address, **credentials) as c:
                with pytest.raises(Exception) as raised:  # the handshake fails
                    await c.describe()
                assert "UNAVAILABLE" in str(raised.value) or "cannot reach" in str(raised.value)
        async with client(f"127.0.0.1:{server.port}") as plaintext:
            with pytest.raises(Exception, match=r"cannot reach|UNAVAILABLE"):
                await plaintext.describe()
        # Kubernetes probes speak plaintext gRPC without certificates: the health port.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as raised:  # nothing else there
                await pb_grpc.AgentServiceStub(channel).Describe(pb.DescribeRequest())
            assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_tls_with_bearer_tokens(pki: Pki, tokens: Tokens) -> None:
    config = AuthConfig(
        tls_cert_file=str(pki.server_cert),
        tls_key_file=str(pki.server_key),
        tokens_file=str(tokens.path),
    )
    async with served(config) as server:
        address = f"localhost:{server.port}"
        async with client(address, tls_ca=pki.ca.read_bytes(), token=tokens.bob) as c:
            await run_once(c)
        async with client(address, tls_ca=pki.ca.read_bytes()) as c:
            with pytest.raises(Unauthenticated, match="missing credentials"):
                await c.describe()
        # The server's name is checked: 127.0.0.1 is in its certificate, other names are not.
        async with client(
            f"127.0.0.1:{server.port}", tls_ca=pki.ca.read_bytes(), tls_server_name="elsewhere"
        ) as c:
            with pytest.raises(Exception, match=r"cannot reach|UNAVAILABLE"):
                await c.describe()


async def test_the_cli_names_tls_as_the_likely_cause_of_a_closed_plaintext_connection(
    pki: Pki,
) -> None:
    config = AuthConfig(
        tls_cert_file=str(pki.server_cert),
        tls_key_file=str(pki.server_key),
        allow_unauthenticated=True,
    )
    async with served(config) as server:
        address = f"127.0.0.1:{server.port}"
        code, _, err = await cli("status", address, "s1")
        assert code == 4 and "Socket closed" in err  # unreachable, as the CLI sees it
        assert "if it serves TLS, give its CA with --tls-ca" in err
        code, _, err = await cli("status", address, "s1", "--tls-ca", str(pki.ca))
        assert code == 2 and "session 's1' not found" in err and "--tls-ca" not in err


def test_client_auth_never_shows_its_secrets(pki: Pki) -> None:
    auth = ClientAuth(token="s3cr3t-token-value-123", **_cert(pki, pki.client_a))  # type: ignore[arg-type]
    assert "s3cr3t" not in repr(auth) and "PRIVATE KEY" not in repr(auth)
    assert "s3cr3t" not in repr(AuthConfig(tokens_file="/etc/helix/auth/tokens"))


async def test_two_client_certificates_are_two_principals(pki: Pki, tokens: Tokens) -> None:
    """Each certificate's identity owns its sessions; a bearer token sent over a client
    certificate names the caller instead (a parent forwarding its caller's token)."""
    config = _mtls_config(pki, tokens_file=str(tokens.path))
    async with served(config) as server:
        address = f"localhost:{server.port}"
        async with client(address, **_cert(pki, pki.client_a)) as a:
            session_id = await run_once(a)
        async with client(address, **_cert(pki, pki.client_b)) as b:
            with pytest.raises(SessionNotFound):
                await b.get_status(session_id)
            mine = await run_once(b)
        async with client(address, **_cert(pki, pki.client_a)) as a:
            assert (await a.get_status(session_id)).session_id == session_id
            with pytest.raises(SessionNotFound):
                await a.get_status(mine)
        # Certificate b, alice's token: alice calls, not b.
        async with client(address, token=tokens.alice, **_cert(pki, pki.client_b)) as alice:
            with pytest.raises(SessionNotFound):
                await alice.get_status(mine)
            alices = await run_once(alice)
        async with client(address, token=tokens.alice, **_cert(pki, pki.client_a)) as alice:
            assert (await alice.get_status(alices)).session_id == alices
        async with client(address, token="forged-token-123456", **_cert(pki, pki.client_a)) as c:
            with pytest.raises(Unauthenticated, match="invalid bearer token"):
                await c.get_status(session_id)  # a bad token is never ignored


def test_a_hash_inside_a_token_is_part_of_it(tmp_path: Path) -> None:
    # Before, each line was cut at its first '#', so a token holding one left a line
    # without its principal, refused as malformed ("expected 'TOKEN PRINCIPAL'").
    path = tmp_path / "tokens"
    path.write_text("# the mesh's tokens\n" + "a" * 20 + "#secret alice acme  # a comment\n")
    tokens = TokenFileAuthenticator.from_file(str(path))
    alice = tokens.authenticate(Presented(bearer="a" * 20 + "#secret"))
    assert alice is not None and (alice.name, alice.tenant) == ("alice", "acme")
    assert tokens.authenticate(Presented(bearer="a" * 20)) is None
