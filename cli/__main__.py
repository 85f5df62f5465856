"""``python -m sessiontree.cli``: the ``sessiontree`` command."""

from sessiontree.cli import main

main(prog_name="sessiontree")
