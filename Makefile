# deerflow-web: `make run` serves the app, `make test` runs the whole suite.
# Both set up .venv on first use; nothing else needs to be installed by hand.

PYTHON ?= python3
VENV ?= .venv
HOST ?= 127.0.0.1
PORT ?= 2026
WORKERS ?= 2
THREADS ?= 8
BIN := $(VENV)/bin

.PHONY: run test lint bench browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]' ruff
	touch $@ $(VENV)/.runtime

# gthread workers read request bodies in large pieces (gunicorn's sync worker halves upload
# throughput); several workers may share one data dir, which the records database allows.
# The bound address joins the hosts the app answers for (server.allowed_hosts).
run: $(VENV)/.runtime
	DEER_FLOW_BIND_HOST=$(HOST) $(BIN)/gunicorn --worker-class gthread \
		--workers $(WORKERS) --threads $(THREADS) --bind $(HOST):$(PORT) \
		--timeout 600 --graceful-timeout 30 --no-control-socket --access-logfile - app:app

# Debian's Chromium for the browser tests; Playwright drives it, no browser is downloaded.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: $(VENV)/.test browser
	$(BIN)/python -m pytest -q

lint: $(VENV)/.test
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(VENV)/.test
	$(BIN)/python bench/bench_uploads.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
