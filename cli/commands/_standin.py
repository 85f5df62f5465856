"""``sessiontree standin``: the stand-in chat model (``sessiontree.testing``)
as a process of its own, for trying a node or an application offline.

It listens on 127.0.0.1 only, prints ``listening on URL`` (the base URL a
provider takes, ending in ``/v1``) and serves until SIGINT or SIGTERM; then
it prints what it served on stderr and exits 0. Exit codes: 1 the port
cannot be bound; 2 a usage error.
"""

from __future__ import annotations

import signal
import sys
import threading

import click

from sessiontree.cli._text import echo
from sessiontree.cli._words import plural
from sessiontree.testing import StandinServer

__all__ = ["standin"]

DEFAULT_PORT = 8471  # beside a node's 8470
DEFAULT_MODELS = ("standin-small", "standin-large")


@click.command("standin")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="The port on 127.0.0.1 (0: any free one; the URL says which).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help=f"A model GET /v1/models lists (repeatable; default: {', '.join(DEFAULT_MODELS)}).",
)
@click.option(
    "--reply",
    "replies",
    multiple=True,
    metavar="TEXT",
    help="Queue this reply (repeatable, taken in order); once they are used, a reply "
    "is 'echo ' and the last user message.",
)
@click.option(
    "--words-per-chunk",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Words in each chunk of a streamed reply.",
)
def standin(
    port: int, models: tuple[str, ...], replies: tuple[str, ...], words_per_chunk: int
) -> None:
    """Run the stand-in chat model (an OpenAI-compatible chat-completions server) on
    127.0.0.1 until SIGINT or SIGTERM.

    Replies are deterministic and tokens are counted as words, so a node or an
    application pointed at it (e.g. node start --model-url URL --model standin-small)
    runs offline and prints the same figures every time.
    """
    server = StandinServer(
        port=port, models=models or DEFAULT_MODELS, words_per_chunk=words_per_chunk
    )
    try:
        server.start()
    except OSError as exc:
        raise click.ClickException(f"cannot listen on 127.0.0.1:{port}: {exc}") from None
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stop.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        if replies:
            server.script(*replies)
        echo(f"listening on {server.url} (models: {', '.join(models or DEFAULT_MODELS)})")
        sys.stdout.flush()
        stop.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        server.close()
    served = server.stats()
    echo(
        f"stand-in stopped: {plural(served.requests_received, 'request')}, "
        f"{plural(served.completions_served, 'completion')}, "
        f"{plural(served.tokens_served, 'token')} served",
        err=True,
    )
