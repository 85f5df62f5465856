# Everything runs in .venv, created on first use. What is installed into it depends on
# the target: `make demo` the core package alone (what the demo needs), `make test` and
# `make lint` the test set (the core with the node, top, ray, otlp, test-traces and
# test extras). A stamp file per set records that it is installed, and is made again
# when pyproject.toml changes; `make install` reinstalls the test set.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EDITABLE := --config-settings editable_mode=strict
TEST_EXTRAS := test,ray,otlp,test-traces
CORE_STAMP := $(VENV)/.installed-core
TEST_STAMP := $(VENV)/.installed-test
MYPY_PACKAGES := -p sessiontree.protocol -p sessiontree.actors -p sessiontree.supervision -p sessiontree.store -p sessiontree.conversations -p sessiontree.testing -p sessiontree.cli

.PHONY: demo test lint install clean

demo: $(CORE_STAMP)
	$(PY) -m sessiontree.cli demo

test: $(TEST_STAMP)
	$(PY) -m pytest -q

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(MYPY_PACKAGES)

install:
	rm -f $(TEST_STAMP)
	$(MAKE) $(TEST_STAMP)

# A venv that could not be made (no ensurepip, say) is removed, so the next run starts over.
$(PY):
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

# The test set includes the core, so it stamps both.
$(CORE_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e . $(EDITABLE)
	touch $@

$(TEST_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[$(TEST_EXTRAS)]' $(EDITABLE)
	touch $@ $(CORE_STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
