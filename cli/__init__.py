"""The command line: ``sessiontree`` (a click group) and its commands.

``main`` is the console script's entry point. This is the only part of
sessiontree that configures logging (to stderr).
"""

from sessiontree.cli._demo import DemoError, DemoReport, run_demo
from sessiontree.cli._main import main

__all__ = ["DemoError", "DemoReport", "main", "run_demo"]
