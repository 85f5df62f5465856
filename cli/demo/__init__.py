"""The demo behind ``sessiontree demo``, written as an application embedding
sessiontree writes one: it imports only the library's public packages
(``sessiontree.supervision``, ``actors``, ``protocol``, ``store``,
``testing``), never the command line's own modules (``tests/test_layout.py``
holds it to that). The command that prints it is ``cli/commands/_demo.py``.

- ``_scenario``: the agent, its skills and the fixed research scenario
  (``run_demo``, its ``DemoReport``, ``DemoError``)
- ``_models``: the model endpoint (the stand-in, or a real one) and the
  usage figures read off the tree
"""

from sessiontree.cli.demo._models import usage_of
from sessiontree.cli.demo._scenario import (
    DEMO_GRACE,
    REAL_MODEL_GRACE,
    DemoError,
    DemoReport,
    run_demo,
)

__all__ = ["DEMO_GRACE", "REAL_MODEL_GRACE", "DemoError", "DemoReport", "run_demo", "usage_of"]
