"""The ``sessiontree`` commands, one module a command group; ``_main`` names
them and ``_lazy`` imports a command's module only when it runs.

- ``_node``: ``node start`` (a standalone node and its HTTP server, ``cli/server``);
  ``_node_settings`` its settings (config file, environment, flags)
- ``_node_status``: ``node status``
- ``_sessions``: ``sessions`` (ls, get, spawn, send, cancel, …)
- ``_conv``: ``conv`` (conversation trees)
- ``_events``: ``events`` (the live event stream)
- ``_recovery``: ``recovery`` and ``wedged``
- ``_replay``: ``replay``
- ``_store``: ``store``, ``export``, ``import``
- ``_standin``: ``standin`` (the stand-in model server)
- ``_demo``: ``demo`` (prints the example application of ``cli/demo``)
- ``_top``: ``top`` (the live view of ``cli/top``)
"""
