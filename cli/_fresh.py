"""A command that fails leaves nothing new on disk.

``node start`` and ``import`` create their store directory when it does not
exist; if they then fail (a store they cannot open, an import file refused),
what they made is taken away again, so the next try starts where the user
did. Nothing that was there before is touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["removed_on_failure"]


@contextmanager
def removed_on_failure(path: Path) -> Iterator[None]:
    """Run the body; when it raises, remove ``path`` if it did not exist before,
    else the entries of the directory ``path`` that are new since (the files a
    store creates in a directory that was empty), then let the error through."""
    before = set(path.iterdir()) if path.is_dir() else None
    existed = path.exists()
    try:
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(path, ignore_errors=True)
        elif before is not None and path.is_dir():
            for entry in set(path.iterdir()) - before:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        raise
