"""A runtime guard for "no ambient state in sessions" (the README's Execution model) (tests only).

While installed, :class:`AmbientGuard` replaces ``os.environ`` (and
``os.environb``) with a proxy and wraps ``os.getenv``, ``os.getenvb``,
``os.putenv``, ``os.unsetenv``, ``os.chdir`` and ``os.fchdir``. Any use from a
thread that runs skills — the step executor's ``sessiontree-step-N`` threads
(sync skills) and the event loop's ``sessiontree-loop`` thread (async
skills) — is recorded as a :class:`Violation` and, by default, refused with
:class:`AmbientStateError` (so the session's result shows the failure).
Other threads (the test, the actors, pytest itself) are left alone.

A name bound before the guard was installed (``from os import environ``) is
out of its reach; the AST scan in ``test_no_ambient_state.py`` covers that.

Use it as the ``ambient_guard`` fixture (the test fails if any violation is
left unclaimed) or as a context manager anywhere else::

    with AmbientGuard() as guard:
        ...
    guard.assert_clean()
"""

from __future__ import annotations

import os
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = [
    "SKILL_THREAD_PREFIXES",
    "AmbientGuard",
    "AmbientStateError",
    "Violation",
    "ambient_guard",
    "on_skill_thread",
]

#: Names of the threads that run skill code (see actors/_execution.py).
SKILL_THREAD_PREFIXES = ("sessiontree-step", "sessiontree-loop")

_GUARDED_FUNCTIONS = ("getenv", "getenvb", "putenv", "unsetenv", "chdir", "fchdir")
_GUARDED_MAPPINGS = ("environ", "environb")


class AmbientStateError(RuntimeError):
    """A skill thread touched the process environment or the working directory."""


@dataclass(frozen=True)
class Violation:
    """One use of ambient state from a skill thread."""

    thread: str
    operation: str
    where: str

    def __str__(self) -> str:
        return f"{self.operation} on thread {self.thread!r} at {self.where}"


def on_skill_thread() -> bool:
    """True when the calling thread runs skills."""
    return threading.current_thread().name.startswith(SKILL_THREAD_PREFIXES)


_STDLIB = sysconfig.get_paths()["stdlib"]


def _caller() -> str:
    """The innermost frame outside this module and the standard library: the skill's
    (or the runtime's) line that reached for ambient state."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename == __file__ or frame.filename.startswith((_STDLIB, "<frozen")):
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


class _GuardedMapping(MutableMapping[Any, Any]):
    """Stands in for ``os.environ``: every use goes through the guard first."""

    def __init__(self, real: MutableMapping[Any, Any], name: str, guard: AmbientGuard) -> None:
        self._real = real
        self._name = name
        self._guard = guard

    def _check(self, what: str) -> None:
        self._guard.check(f"{self._name}{what}")

    def __getitem__(self, key: Any) -> Any:
        self._check(f"[{key!r}]")
        return self._real[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check(f"[{key!r}] = ...")
        self._real[key] = value

    def __delitem__(self, key: Any) -> None:
        self._check(f"del [{key!r}]")
        del self._real[key]

    def __iter__(self) -> Iterator[Any]:
        self._check(" iterated")
        return iter(self._real)

    def __len__(self) -> int:
        self._check(" len()")
        return len(self._real)

    def __contains__(self, key: object) -> bool:
        self._check(f" contains {key!r}")
        return key in self._real

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(f".get({key!r})")
        return self._real.get(key, default)

    def copy(self) -> dict[Any, Any]:
        self._check(".copy()")
        return dict(self._real)

    def __repr__(self) -> str:
        return f"guarded({self._real!r})"

    def __getattr__(self, name: str) -> Any:  # encodekey, _data, … of the real mapping
        self._check(f".{name}")
        return getattr(self._real, name)


class AmbientGuard:
    """Records (and by default refuses) ambient-state use from skill threads.

    ``raise_on_violation=False`` only records, letting the call through.
    Install it once at a time; it is not re-entrant.
    """

    def __init__(self, *, raise_on_violation: bool = True) -> None:
        self.raise_on_violation = raise_on_violation
        self._violations: list[Violation] = []
        self._lock = threading.Lock()
        self._saved: dict[str, Any] = {}

    # -- installing -----------------------------------------------------------

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self) -> AmbientGuard:
        """Patch ``os``; undo with :meth:`uninstall`."""
        if self._saved:
            msg = "the ambient guard is already installed"
            raise RuntimeError(msg)
        for name in _GUARDED_MAPPINGS:
            if hasattr(os, name):
                real = getattr(os, name)
                self._saved[name] = real
                setattr(os, name, _GuardedMapping(real, f"os.{name}", self))
        for name in _GUARDED_FUNCTIONS:
            if hasattr(os, name):
                real_fn = getattr(os, name)
                self._saved[name] = real_fn
                setattr(os, name, self._wrap(name, real_fn))
        return self

    def uninstall(self) -> None:
        """Put the real ``os`` functions and mappings back."""
        saved, self._saved = self._saved, {}
        for name, value in saved.items():
            setattr(os, name, value)

    def __enter__(self) -> AmbientGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            shown = ", ".join(repr(a) for a in args[:1])
            self.check(f"os.{name}({shown})")
            if name in ("getenv", "getenvb"):  # read the real mapping: one record, not two
                mapping = self._saved["environ" if name == "getenv" else "environb"]
                key, default = args[0], args[1] if len(args) > 1 else kwargs.get("default")
                return mapping.get(key, default)
            return real(*args, **kwargs)

        guarded.__name__ = name
        guarded.__qualname__ = f"guarded_{name}"
        return guarded

    # -- checking ---------------------------------------------------------------

    def check(self, operation: str) -> None:
        """Record ``operation`` if the calling thread runs skills (and raise, if set to)."""
        if not on_skill_thread():
            return
        violation = Violation(threading.current_thread().name, operation, _caller())
        with self._lock:
            self._violations.append(violation)
        if self.raise_on_violation:
            msg = f"ambient state used in a skill execution path: {violation}"
            raise AmbientStateError(msg)

    @property
    def violations(self) -> list[Violation]:
        """Everything recorded so far (a copy)."""
        with self._lock:
            return list(self._violations)

    def take(self) -> list[Violation]:
        """Return the recorded violations and forget them (a test that expects some)."""
        with self._lock:
            taken, self._violations = self._violations, []
        return taken

    def assert_clean(self) -> None:
        """Fail unless nothing was recorded (and not taken)."""
        found = self.violations
        if found:
            lines = "\n  ".join(str(v) for v in found)
            pytest.fail(f"{len(found)} ambient-state violation(s) from skill threads:\n  {lines}")


@pytest.fixture
def ambient_guard() -> Iterator[AmbientGuard]:
    """An installed :class:`AmbientGuard` for the test's duration; the test fails
    on any violation it did not ``take()``."""
    guard = AmbientGuard()
    with guard:
        yield guard
    guard.assert_clean()
