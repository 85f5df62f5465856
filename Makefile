# Everything runs in .venv, created (and the project installed into it) on first use.
# `make install` reinstalls into the existing venv, e.g. after pyproject.toml changed.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install -q -e '.[test,ray,otlp,test-traces]' --config-settings editable_mode=strict
MYPY_PACKAGES := -p sessiontree.protocol -p sessiontree.actors -p sessiontree.supervision -p sessiontree.store -p sessiontree.conversations -p sessiontree.cli

.PHONY: demo test lint install clean

demo: $(PY)
	$(PY) -m sessiontree.cli demo

test: $(PY)
	$(PY) -m pytest -q

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(MYPY_PACKAGES)

install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL)

# A venv whose install failed is removed, so the next run starts over.
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) || { rm -rf $(VENV); exit 1; }

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
