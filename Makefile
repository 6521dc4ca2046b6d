# Two commands set up a fresh machine: `make run` (whole stack) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run runtime test test-long e2e browser lint fmt setup lock bench loadtest chaos clean check-deploy image smoke-image

SEEDS ?= 5
# pytest-xdist workers for the quick tier: on two cores two take it from 11 to 7 minutes.
QUICK_WORKERS ?= 2
CHAOS_DURATION_S ?= 20

# Runtime dependencies only (no test, lint or load tools): the first run installs them, later
# runs start at once (the stamp files are newer than pyproject.toml, uv.lock and
# package-lock.json).
run: runtime
	$(BIN)/timeline run

# The quick tier: every behaviour at the smallest size that proves it (tests not marked `long`).
test: setup lint
	$(BIN)/pytest -m "not long" -n $(QUICK_WORKERS)

# The long tier: what needs size or minutes (chaos variants, the bench and load-test smoke
# runs, full-size fuzzing, large loops, kills under load), one at a time: each loads the
# machine on its own.
test-long: setup
	$(BIN)/pytest -m long

# The web client in headless Chromium against the whole stack (tests/e2e; not in `make test`).
e2e: setup $(VENV)/.e2e-installed browser
	$(BIN)/pytest tests/e2e

$(VENV)/.e2e-installed: pyproject.toml uv.lock $(VENV)/.installed
	$(UV_SYNC) --extra dev --extra load --extra e2e
	touch $@

# Debian's Chromium and its chromedriver, unless both are there (apt-get as root, else sudo).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; else \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		echo "installing chromium and chromium-driver with $${SUDO:-root} apt-get"; \
		$$SUDO apt-get update -q && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	fi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Hunt for broken guarantees: SEEDS seeds of each chaos variant, CHAOS_DURATION_S each.
chaos: setup
	CHAOS_SEEDS=$(SEEDS) CHAOS_DURATION_S=$(CHAOS_DURATION_S) $(BIN)/pytest -s tests/system/test_chaos.py

bench: setup
	$(BIN)/python -m loadtest.bench

loadtest: setup
	$(BIN)/python -m loadtest.run

# The container image and the Azure deployment (docs/deploy.md). checkov lives in a venv of
# its own (CHECK_VENV), never in .venv; its version is pinned in deploy/requirements-check.txt.
CHECK_VENV ?= /tmp/timeline-check-venv
CONTAINER_TOOL ?= podman
IMAGE ?= localhost/timeline:dev
BASE_IMAGE ?= docker.io/library/python:3.12-slim-bookworm

check-deploy: $(CHECK_VENV)/.installed
	$(CHECK_VENV)/bin/checkov --skip-download --quiet --compact --framework dockerfile --file Dockerfile
	$(CHECK_VENV)/bin/checkov --skip-download --quiet --compact --framework bicep --directory deploy/azure

$(CHECK_VENV)/.installed: deploy/requirements-check.txt
	$(PYTHON) -m venv $(CHECK_VENV)
	$(CHECK_VENV)/bin/pip install --quiet -r deploy/requirements-check.txt
	touch $@

image:
	$(CONTAINER_TOOL) build --build-arg BASE=$(BASE_IMAGE) -t $(IMAGE) .

smoke-image: setup
	$(BIN)/python deploy/container/smoke.py --image $(IMAGE) --tool $(CONTAINER_TOOL)

fmt: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

runtime: $(VENV)/.runtime-installed node_modules/.installed

setup: $(VENV)/.installed node_modules/.installed

# The Python packages come at the exact versions in uv.lock, installed by uv (its own venv,
# UV_DIR; its version and hashes in requirements-uv.txt), the project itself editable.
# --locked stops when uv.lock no longer matches pyproject.toml (then `make lock`); --inexact
# keeps what another target added (an extra, pip).
UV_DIR := .uv
UV := $(UV_DIR)/bin/uv
UV_SYNC := UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --quiet --locked --inexact --no-python-downloads

$(VENV)/.runtime-installed: pyproject.toml uv.lock $(UV_DIR)/.installed
	$(PYTHON) -m venv $(VENV)
	$(UV_SYNC)
	touch $@

# The development extras: tests, lint, types, benchmarks and the load test.
$(VENV)/.installed: pyproject.toml uv.lock $(VENV)/.runtime-installed
	$(UV_SYNC) --extra dev --extra load
	touch $@

$(UV_DIR)/.installed: requirements-uv.txt
	$(PYTHON) -m venv $(UV_DIR)
	$(UV_DIR)/bin/pip install --quiet --disable-pip-version-check -r requirements-uv.txt
	touch $@

# Re-resolves uv.lock after a change to pyproject.toml, keeping every locked version that
# still fits; UPGRADE=NAME (or several names) takes those packages' newest allowed versions,
# UPGRADE=all every package's. Then run the tests (docs/development.md#dependencies).
lock: $(UV_DIR)/.installed
	$(UV) lock --no-python-downloads $(if $(filter all,$(UPGRADE)),--upgrade,$(addprefix --upgrade-package ,$(UPGRADE)))

node_modules/.installed: package.json package-lock.json
	npm ci --omit=dev --no-audit --no-fund --loglevel=error
	touch $@

clean:
	rm -rf $(VENV) $(UV_DIR) node_modules .mypy_cache .ruff_cache .pytest_cache
