"""The Quick start's first command on a fresh clone (issue 39): ``make demo``
makes the venv, installs the core package alone into it and runs the demo;
the test command then installs the test set into that same venv.

A real ``git clone`` of this repository's current commit, a real ``python -m
venv`` and pip (with its cache, so a machine that installed once installs
again in seconds). Needs git and make; under ``CI=true`` a missing one fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What the core must not bring: the node's server, the live view, the test
#: tools and the heavy extras (distribution names, lower case).
NOT_CORE = {
    "arize-phoenix",
    "litestar",
    "opentelemetry-sdk",
    "playwright",
    "pytest",
    "ray",
    "schemathesis",
    "textual",
    "uvicorn",
}
CORE = {"sessiontree", "pykka", "msgspec", "lmdb", "click", "httpx", "openai"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed (needed to check the Quick start)")
        pytest.skip(f"{name} is not installed")
    return found


def _run(*args: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], str]:
    """A clone of this commit after ``make demo``: its folder, the environment
    the commands run in, and what ``make demo`` printed."""
    git, make = _tool("git"), _tool("make")
    inside = subprocess.run(
        [git, "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if inside.returncode != 0:
        pytest.skip("not a git checkout: there is nothing to clone")
    folder = tmp_path_factory.mktemp("quick-start") / "sessiontree"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"}
    }
    _run(git, "clone", "-q", str(ROOT), str(folder), cwd=ROOT, env=env)
    _run(git, "checkout", "-q", inside.stdout.strip(), cwd=folder, env=env)
    shown = _run(make, "demo", f"PYTHON={sys.executable}", cwd=folder, env=env)
    return folder, env, shown


def _installed(folder: Path, env: dict[str, str]) -> set[str]:
    listing = _run(
        str(folder / ".venv/bin/python"),
        "-c",
        "import importlib.metadata as m, json; "
        "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))",
        cwd=folder,
        env=env,
    )
    return {name.lower().replace("_", "-") for name in json.loads(listing)}


def test_make_demo_installs_only_the_core_and_runs_the_demo(
    clone: tuple[Path, dict[str, str], str],
) -> None:
    folder, env, shown = clone
    assert "Final tree:" in shown
    assert "Finished in" in shown
    installed = _installed(folder, env)
    assert installed >= CORE
    assert installed.isdisjoint(NOT_CORE), sorted(installed & NOT_CORE)


def test_a_core_install_refuses_node_start_naming_the_extra(
    clone: tuple[Path, dict[str, str], str],
) -> None:
    folder, env, _ = clone
    cli = str(folder / ".venv/bin/sessiontree")
    assert _run(cli, "--version", cwd=folder, env=env).startswith("sessiontree, version")
    store = folder / "node-store"
    done = subprocess.run(
        [cli, "node", "start", "--store", str(store)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'sessiontree[node]'" in done.stderr
    assert not store.exists()


def test_the_test_command_then_installs_the_test_set_into_that_venv(
    clone: tuple[Path, dict[str, str], str],
) -> None:
    """``make test`` after ``make demo`` installs the test extras first (shown
    with ``make -n``: the install itself is CI's)."""
    folder, env, _ = clone
    planned = _run(_tool("make"), "-n", "test", f"PYTHON={sys.executable}", cwd=folder, env=env)
    lines = planned.splitlines()
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    assert "-e '.[test,ray,otlp,test-traces]'" in lines[install]
    assert lines[-1].endswith("-m pytest -q")
    assert install < len(lines) - 1


def test_the_readme_says_what_each_command_installs() -> None:
    """The Quick start names the core's dependencies and the test set's extras
    as pyproject.toml and the Makefile have them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = " ".join(readme[readme.index("## Quick start") : readme.index("## Embedding")].split())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        assert re.split(r"[<>=\[ ]", requirement)[0] in quick, requirement
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    extras = re.search(r"^TEST_EXTRAS := (\S+)$", makefile, re.MULTILINE)
    assert extras is not None
    assert f"`pip install -e '.[{extras[1]}]'" in quick
    assert "`make demo` installs the core package alone (`pip install -e . " in quick
    test_set = project["optional-dependencies"]["test"]
    nested = next(
        re.fullmatch(r"sessiontree\[(.+)\]", r) for r in test_set if r.startswith("sessiontree[")
    )
    assert nested is not None
    for extra in {*extras[1].split(","), *nested[1].split(",")} - {"test"}:
        assert f"`{extra}`" in quick, extra
