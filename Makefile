# deerflow-web: `make run` serves the app, `make test` runs the whole suite.
# Both set up .venv on first use; nothing else needs to be installed by hand.

PYTHON ?= python3
VENV ?= .venv
HOST ?= 127.0.0.1
PORT ?= 2026
WORKERS ?= 2
CONNECTIONS ?= 1000
TEST_WORKERS ?= auto
BIN := $(VENV)/bin

.PHONY: run worker test lint bench bench-small bench-scale bench-instances bench-workers bench-quotas bench-ocr bench-versions bench-storage bench-backends browser postgres nginx fonts clamav clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# OCR (services/conversion/ocr.py) needs OpenCV, which rapidocr-onnxruntime pulls as
# opencv-python, linked against the system's libGL. Where that library is missing (a bare
# server), the headless build of the same OpenCV, which needs none, takes its place.
define opencv_without_libgl
	$(BIN)/python -c "import cv2" 2>/dev/null || { \
		$(BIN)/pip uninstall --quiet -y opencv-python && \
		$(BIN)/pip install --quiet --no-deps opencv-python-headless; }
endef

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	$(opencv_without_libgl)
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]' ruff
	$(opencv_without_libgl)
	touch $@ $(VENV)/.runtime

# gevent workers (web/transport/server.py) hold each connection in a greenlet, so hundreds of slow
# uploads and downloads wait without taking a thread each; the worker adds back kernel
# sendfile, the idle timeout, the minimum body rate and the cap per client address
# (server.* in config.yaml). Several workers share one data dir (the records database
# allows it). One access-log line per request, with its duration in milliseconds.
# The bound address joins the hosts the app answers for (server.allowed_hosts).
run: $(VENV)/.runtime
	ulimit -n $$(ulimit -Hn) 2>/dev/null || true; \
	DEER_FLOW_BIND_HOST=$(HOST) $(BIN)/gunicorn --worker-class deerflow_web.web.transport.server.Worker \
		--workers $(WORKERS) --worker-connections $(CONNECTIONS) --bind $(HOST):$(PORT) \
		--timeout 600 --graceful-timeout 30 --no-control-socket --access-logfile - \
		--access-logformat '%(h)s "%(r)s" %(s)s %(b)s %(M)sms' app:app

# The background jobs alone (conversions, rescans, sweeps), with no HTTP server, for web
# instances with `jobs.run_in_web: false` on the same database and data dir (docs/deploy.md).
worker: $(VENV)/.runtime
	$(BIN)/flask --app app worker

# Debian's Chromium for the browser tests; Playwright drives it, no browser is downloaded.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Debian's PostgreSQL server binaries: the tests start a throw-away server with them
# (tests/support/postgres.py) unless TEST_DATABASE_URL names one.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ -n "$$TEST_DATABASE_URL" ] || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq postgresql >/dev/null; }

# Debian's nginx for the tests of deploy/nginx.conf; the tests run it as a private process.
nginx:
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq nginx >/dev/null; }

# Debian's Noto CJK font: the OCR tests draw English and Chinese text with it.
fonts:
	@[ -f /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc ] || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq fonts-noto-cjk >/dev/null; }

# Debian's clamd and sigtool for the virus-scanning tests: the suite starts its own clamd on a
# unix socket with a signature database it builds (tests/support/clamd.py); no signatures
# are downloaded and no system daemon is started.
clamav:
	@{ [ -x /usr/sbin/clamd ] && command -v sigtool >/dev/null 2>&1; } || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq clamav-daemon clamav >/dev/null; }

# The suite runs in both modes of SPEC 7.1: accounts on (the default), then the single-user
# mode of the first release, where behaviour differs. The browser tests run in the first pass
# only: each file-manager test serves both modes itself (its `mode` parameter: signed in
# through the login page with accounts on, and single-user), which DEER_FLOW_AUTH_DISABLED=1
# would prevent, since it forces accounts off; the account tests need accounts on. Modules
# marked `same_in_both_modes` (nothing in them reads the mode, or real processes whose mode
# changes only the gate) run in the first pass only. Each pass runs on TEST_WORKERS
# processes (pytest-xdist, one per core by default), a test module at a time each, so a
# module's servers start once; every process starts its own PostgreSQL, clamd and browser.
# A third pass runs the upload API's suites again on `storage.backend: s3` (a real
# SeaweedFS, a bucket prefix per app), but for the tests of files put in the data dir by hand,
# which only the local backend adopts (`local_disk`).
S3_SUITE = tests/web/api/test_upload.py tests/web/api/test_list_delete.py \
	tests/web/api/test_history.py tests/web/api/test_threads.py tests/web/api/test_tus.py
test: $(VENV)/.test browser postgres nginx fonts clamav
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
	DEER_FLOW_AUTH_DISABLED=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		-m "not browser and not same_in_both_modes"
	DEER_FLOW_TEST_STORAGE=s3 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		-m "not local_disk" $(S3_SUITE)

lint: $(VENV)/.test
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(VENV)/.test
	$(BIN)/python bench/bench_uploads.py

# Requests of ten 10 KB files: accounts off, on with a token, and into a 10,000-file thread.
bench-small: $(VENV)/.test
	$(BIN)/python bench/bench_small_files.py

# Slow clients, no-regression ratios against the previous server, lists at scale.
bench-scale: $(VENV)/.test
	$(BIN)/python bench/bench_scale.py

# One instance vs two on one data dir; list latency on SQLite (and on $DATABASE_URL if set).
bench-instances: $(VENV)/.test
	$(BIN)/python bench/bench_instances.py

# Conversions run by the web instance against conversions handed to a worker, same run.
bench-workers: $(VENV)/.test
	$(BIN)/python bench/bench_workers.py

# Small-file uploads with storage quotas on vs off, in the same run.
bench-quotas: $(VENV)/.test
	$(BIN)/python bench/bench_quotas.py

# OCR seconds per page (text layer, scanned page, photo), worker memory peak, OCR quality.
bench-ocr: $(VENV)/.test fonts
	$(BIN)/python bench/bench_ocr.py

# The cost of keeping replaced bytes as versions: a 100 MiB replace and small uploads,
# with and without versions, same run (issue 27).
bench-versions: $(VENV)/.test
	$(BIN)/python bench/bench_versions.py

# The local and S3 object stores (SeaweedFS on loopback): 1 GiB write, 100 MiB read, memory,
# a 1,000-object listing, the event loop's stalls.
bench-storage: $(VENV)/.test
	$(BIN)/python bench/bench_storage_backends.py

# The app under gunicorn on storage.backend local and s3 (SeaweedFS), same run: a 1 GiB
# upload, 100 MiB downloads (s3: on a second instance whose working copy lacks the file),
# the list of a 1,000-file thread, the servers' peak RSS; ratios s3/local (issue 29).
bench-backends: $(VENV)/.test
	$(BIN)/python bench/bench_app_backends.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
