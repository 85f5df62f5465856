"""``python -m sessiontree.cli``: the ``sessiontree`` command.

``-m`` puts the working directory first on ``sys.path`` (the ``sessiontree``
script does not); it is taken off before the command runs, so a module lying
in the folder a node starts in is not imported by a later, lazy import in its
place. Only an ``--agents`` module found nowhere else is imported from there
(``_agents``). What the package imports at once is imported before this runs:
``python -P -m`` (or the ``sessiontree`` script) keeps the folder out entirely.
"""

import os
import sys

from sessiontree.cli import main

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

main(prog_name="sessiontree")
