"""The bearer token of a node's API, on both sides: the node reads it from
``node start --token-file``; client commands send the one their
``sessiontree --token-file PATH`` (or ``SESSIONTREE_TOKEN_FILE``) names.

A token file holds the token alone (surrounding whitespace, a final newline
included, is ignored). An empty or unreadable file is a usage error (exit 2)
naming the option and the file. A token or key file that its group or
everyone may read is still read, with one warning naming it and its mode
(``warn_if_exposed``).
"""

from __future__ import annotations

import ipaddress
import logging
import stat
from pathlib import Path

import click

__all__ = ["TOKEN_META", "auth_headers", "is_loopback", "read_token", "warn_if_exposed"]

log = logging.getLogger("sessiontree.cli")

_warned: set[Path] = set()  # each file is warned about once a process

TOKEN_META = "sessiontree.token_file"  # noqa: S105 - a key of click's meta, not a secret
"""Where the root command keeps ``--token-file`` in the click context's ``meta``."""


def read_token(path: Path | None, option: str = "--token-file") -> str | None:
    """The token in ``path`` (None without a path); ``click.BadParameter``
    naming ``option`` for a file that cannot be read or holds no token."""
    if path is None:
        return None
    warn_if_exposed(Path(path), option)
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint=option) from None
    if not token:
        raise click.BadParameter(f"{path} holds no token (it is empty)", param_hint=option)
    if any(c.isspace() or not c.isprintable() for c in token):
        msg = f"{path}: the token must be one line of printable characters without spaces"
        raise click.BadParameter(msg, param_hint=option)
    return token


def warn_if_exposed(path: Path, option: str) -> None:
    """Log one warning if the secret file ``path`` (given with ``option``) may
    be read by its group or by everyone; a file that cannot be looked at is
    left to whoever reads it next to report."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH) and path not in _warned:
        _warned.add(path)
        who = "everyone" if mode & stat.S_IROTH else "its group"
        log.warning(
            "%s %s may be read by %s (mode %04o): chmod 600 %s", option, path, who, mode, path
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, localhost)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def auth_headers() -> dict[str, str]:
    """The ``Authorization`` header a client command sends: the token of the
    root command's ``--token-file`` (or ``SESSIONTREE_TOKEN_FILE``), else none."""
    ctx = click.get_current_context(silent=True)
    path = ctx.find_root().meta.get(TOKEN_META) if ctx is not None else None
    token = read_token(path)
    return {} if token is None else {"Authorization": f"Bearer {token}"}
