"""The command line: ``sessiontree`` (a click group) and its commands.

``main`` is the console script's entry point. This is the only part of
sessiontree that configures logging (to stderr). Importing it loads click
and nothing of the runtime: each command's module is imported when that
command runs, and ``run_demo`` (with its report and error) when first used.
"""

from typing import TYPE_CHECKING, Any

from sessiontree.cli._main import main

if TYPE_CHECKING:
    from sessiontree.cli.demo import DemoError, DemoReport, run_demo

__all__ = ["DemoError", "DemoReport", "main", "run_demo"]

_DEMO = frozenset({"DemoError", "DemoReport", "run_demo"})


def __getattr__(name: str) -> Any:
    """The demo's names, imported with the runtime on first use."""
    if name in _DEMO:
        from sessiontree.cli import demo  # noqa: PLC0415 - the runtime, only when asked for

        return getattr(demo, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
