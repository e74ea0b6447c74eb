"""`yieldstar ui`: serve the web UI over the ledger (SPEC section 13; `supervisor.ui`).

The command checks `--addr`, binds the socket itself (so a taken port is one line naming
`--addr`, and `--addr 127.0.0.1:0` prints the port it got), then hands the socket to uvicorn.
Starlette, Jinja2 and uvicorn are the `ui` extra, imported only here, only when the command runs.
"""

from __future__ import annotations

import socket
import sys

import click

from ..ledger.backends import shown
from . import backend_of, closed_down, fail, handles_errors, main, params

DEFAULT_ADDR = "127.0.0.1:8080"
INSTALL = "pip install 'yieldstar[ui]'"


def parse_addr(text: str) -> tuple[str, int]:
    """`--addr`, as `params.listen_address` reads it (a ValueError names `--addr`)."""
    return params.listen_address("--addr", text, 8080)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` and listening; an OSError names the address."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"--addr {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ValueError(f"--addr {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


@main.command()
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, metavar="HOST:PORT",
              help="Where to listen: HOST:PORT, or a port alone (loopback). Only loopback unless told otherwise.")
@click.pass_context
@handles_errors
def ui(ctx, addr: str) -> None:
    """Serve a web UI over the ledger, and the same data as JSON under /api/.

    Executions with the ls filters; one execution's steps, waits and lease timeline; queues,
    schedules and live supervisors; cancel and resume with a confirmation."""
    host, port = parse_addr(addr)
    try:
        import uvicorn

        from ..ui.app import create_app
        from ..ui.guard import hosts_for
    except ImportError as exc:
        fail(f"yieldstar ui needs the ui extra ({(exc.name or 'a library').split('.')[0]} is not installed): {INSTALL}")
    with backend_of(ctx, create=False) as backend:
        sock = listening_socket(host, port)
        with sock:
            app = create_app(backend, allowed_hosts=hosts_for(host))
            click.echo(f"serving the UI of {shown(ctx.obj['db'])} at {url_of(sock)} (Ctrl-C stops)")
            sys.stdout.flush()  # a script that started it reads the address now, not at exit
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt:
                pass  # uvicorn stopped gracefully, then raised the SIGINT again: Ctrl-C is how one stops it
    closed_down()
