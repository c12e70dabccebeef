"""``helix-mesh inspect``: a local web page of one service's sessions and their live
delegation trees, served by the CLI process on 127.0.0.1.

``app.py`` is the HTTP side (starlette, run by uvicorn), ``feed.py`` folds a session's
stream for the page, and ``static/`` is the page itself (HTML, CSS and JavaScript, no
build step), shipped in the wheel.
"""

from __future__ import annotations

import socket
from urllib.parse import quote

from helix_transport._exceptions import UsageError
from helix_transport._optional import requires
from helix_transport.transport import ClientAuth, ClientPool

with requires("inspect", "helix-mesh inspect (the web page)"):
    import uvicorn

    from helix_transport.cli.inspector.app import GUARD_HEADER, Inspector

__all__ = ["GUARD_HEADER", "Inspector", "serve_inspector"]

_HOST = "127.0.0.1"
_SHUTDOWN_S = 2.0  # open event streams end with the process; do not wait on them longer


async def serve_inspector(
    address: str, *, port: int, auth: ClientAuth | None = None, session_id: str = ""
) -> None:
    """Serve the page for ``address`` on 127.0.0.1:``port`` (0: any free port) until
    SIGINT or SIGTERM. Prints the page's URL first.

    Raises:
        UsageError: the port is taken.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((_HOST, port))
    except OSError as exc:
        listener.close()
        raise UsageError(
            f"--port {port}: cannot listen on {_HOST}:{port} ({exc.strerror})"
        ) from None
    # Listening before the URL is printed: a browser opened on it at once waits in the
    # backlog until the server accepts, instead of being refused.
    listener.listen(128)
    url = f"http://{_HOST}:{listener.getsockname()[1]}/"
    if session_id:
        url += f"#session={quote(session_id, safe='')}"
    pool = ClientPool(auth=auth)
    config = uvicorn.Config(
        Inspector(address, pool).app(),
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=int(_SHUTDOWN_S),
    )
    print(f"helix-mesh inspect: {url} (inspecting {address}; Ctrl-C stops)", flush=True)
    try:
        await uvicorn.Server(config).serve(sockets=[listener])
    finally:
        listener.close()
        await pool.aclose()
