"""Command groups whose commands are imported only when one runs.

A command's module may pull in the whole runtime (the demo, ``node start``),
Litestar or Textual; ``sessiontree --version``, ``--help`` or ``sessions ls``
need none of that. ``LazyGroup`` names each command by the module and
attribute that define it and by its one-line help, so listing the commands
imports nothing and running one imports only its module.

It also makes the root's options global: every command loaded through a
``LazyGroup`` takes ``-v``/``--verbose`` and ``--token-file`` after its own
name too (``sessiontree sessions ls --token-file F`` is ``sessiontree
--token-file F sessions ls``), unless it has an option of that name itself
(``node start --token-file`` is the node's own token).

A command whose module needs an extra that is not installed (``node``:
Litestar and uvicorn; ``top``: Textual) is refused before it runs with
``MissingExtra``: exit 2, naming the extra and the ``pip install`` that adds
it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

from sessiontree.cli._token import TOKEN_META

__all__ = [
    "EXTRAS",
    "VERBOSE_META",
    "Lazy",
    "LazyGroup",
    "MissingExtra",
    "needs_extra",
    "remember_logging",
]

VERBOSE_META = "sessiontree.verbose"
"""Where the root command keeps ``-v``'s count in the click context's ``meta``."""

#: The extras of the package that some commands need, with the top-level
#: modules each installs (pyproject.toml's optional dependencies).
EXTRAS: Mapping[str, tuple[str, ...]] = {
    "node": ("litestar", "uvicorn"),
    "top": ("textual", "rich"),
}


class MissingExtra(click.ClickException):
    """A command needs an extra of the package that is not installed (exit 2)."""

    exit_code = 2

    def __init__(self, command: str, extra: str, module: str) -> None:
        super().__init__(
            f"'{command}' needs the {extra} extra ({', '.join(EXTRAS[extra][:2])}), which is "
            f"not installed (no module named {module!r}): pip install 'sessiontree[{extra}]'"
        )
        self.command = command
        self.extra = extra
        self.module = module


@contextmanager
def needs_extra(command: str, extra: str) -> Iterator[None]:
    """Run the body (an import); a ``ModuleNotFoundError`` for one of ``extra``'s
    modules becomes ``MissingExtra``. Any other import error propagates."""
    try:
        yield
    except ModuleNotFoundError as exc:
        root = (exc.name or "").partition(".")[0]
        if root in EXTRAS[extra]:
            raise MissingExtra(command, extra, root) from None
        raise


@dataclass(frozen=True, slots=True)
class Lazy:
    """Where a command is defined (``module:attribute``), the one-line help
    ``--help`` lists, and the extra its module needs (None: only the core)."""

    target: str
    help: str
    extra: str | None = None


class LazyGroup(click.Group):
    """A ``click.Group`` whose commands are ``Lazy`` entries, imported the first
    time one is asked for (run, completed, or shown with its own ``--help``)."""

    def __init__(self, *args: object, lazy: Mapping[str, Lazy], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(self._load(ctx, cmd_name), cmd_name)
        command = self.commands.get(cmd_name)
        if command is not None:
            _add_global_options(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one-line help, without importing any of them."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            if name in self.lazy:  # a stand-in command shortens the line as click would
                line = click.Command(name, help=self.lazy[name].help).get_short_help_str(limit)
                rows.append((name, line))
            elif not self.commands[name].hidden:
                rows.append((name, self.commands[name].get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _load(self, ctx: click.Context, name: str) -> click.Command:
        entry = self.lazy[name]
        module_name, _, attribute = entry.target.partition(":")
        path = f"{ctx.command_path} {name}"
        if entry.extra is None:
            module = importlib.import_module(module_name)
        else:
            with needs_extra(path, entry.extra):
                module = importlib.import_module(module_name)
        command = getattr(module, attribute)
        if not isinstance(command, click.Command):  # a wrong table entry, not a user's error
            msg = f"{entry.target} is not a click command"
            raise TypeError(msg)
        return command


# -- the root's options, after the subcommand ----------------------------------------------

_GLOBAL_MARK = "_sessiontree_global_options"
_CONFIGURE_META = "sessiontree.configure_logging"


def _token_file(ctx: click.Context, _: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.find_root().meta[TOKEN_META] = value


def _verbose(ctx: click.Context, _: click.Parameter, value: int) -> None:
    if value:
        root = ctx.find_root()
        root.meta[VERBOSE_META] = root.meta.get(VERBOSE_META, 0) + value
        configure = root.meta.get(_CONFIGURE_META)
        if configure is not None:
            configure(root.meta[VERBOSE_META])


def remember_logging(ctx: click.Context, verbosity: int, configure: Callable[[int], None]) -> None:
    """What the root does with its own ``-v``: record the count and how to set
    the level, so a ``-v`` after the subcommand adds to it."""
    ctx.meta[VERBOSE_META] = verbosity
    ctx.meta[_CONFIGURE_META] = configure
    configure(verbosity)


def _global_options() -> list[click.Parameter]:
    return [
        click.Option(
            ["-v", "--verbose"],
            count=True,
            expose_value=False,
            callback=_verbose,
            allow_from_autoenv=False,
            help="More logging on stderr (-v info, -vv debug), as sessiontree -v.",
        ),
        click.Option(
            ["--token-file"],
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            expose_value=False,
            callback=_token_file,
            allow_from_autoenv=False,
            help="A file holding the node's bearer token, as sessiontree --token-file FILE.",
        ),
    ]


def _add_global_options(command: click.Command) -> None:
    """Give ``command`` (and, for a plain group, each of its commands) the root's
    options it does not define itself; once per command."""
    if getattr(command, _GLOBAL_MARK, False):
        return
    setattr(command, _GLOBAL_MARK, True)
    if isinstance(command, click.Group) and not isinstance(command, LazyGroup):
        for sub in command.commands.values():  # a LazyGroup does it as it loads them
            _add_global_options(sub)
    taken = {opt for param in command.params for opt in param.opts}
    for option in _global_options():
        if not taken.intersection(option.opts):
            command.params.append(option)
