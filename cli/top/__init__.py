"""``sessiontree top``: a live view of a node in the terminal (Textual, the
``top`` extra). The command is ``cli/commands/_top.py``; Textual is imported
only by ``_app``, once the command runs.

- ``_source``: polls the node's HTTP API for snapshots
- ``_data``: the counters and rows a snapshot becomes
- ``_app``: the Textual application that shows them
"""
