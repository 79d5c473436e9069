# fabricd — the two commands a new user needs: `make demo` and `make test`.
# Both create .venv/ in the checkout and install what they need themselves.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv demo test lint bench deps clean help

help:
	@echo "make demo   - central service + simulated cluster on this machine (SQLite)"
	@echo "make test   - set up .venv and run the test suite"
	@echo "make lint   - ruff check, ruff format --check, mypy, lint-imports (import directions)"
	@echo "make bench  - benchmarks (fabricd vs node_exporter, ingest vs bare SQLite), see docs/benchmarks.md"
	@echo "make deps   - install the system packages the tests use (Debian/Ubuntu, as root)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fabricd needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

deps:
	bash deploy/install-system-deps.sh

demo: venv
	$(VENV)/bin/fabricd demo

test: venv
	$(PY) -m pytest

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache --no-logo

bench: venv
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) data build *.egg-info .pytest_cache .mypy_cache .ruff_cache
