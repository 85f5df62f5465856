"""Running Prometheus's ``promtool`` from tests (Debian package ``prometheus``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

__all__ = ["promtool"]


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``promtool args…`` (feeding ``stdin``) and return what it did. Under CI
    (``CI=true``) a missing promtool fails the test; elsewhere it skips it."""
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI: .ci/run installs Debian's prometheus")
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return subprocess.run([tool, *args], input=stdin, capture_output=True, timeout=60, check=False)
