# helix-mesh developer tasks. `make test` is what CI runs (.ci/run).
#
# The Makefile bootstraps its own virtualenv in .venv and reinstalls it only when
# pyproject.toml changes (the .venv/.installed stamp). It holds every extra ([all]: the
# Redis and PostgreSQL backends, span exporters, the inspector page, the Prometheus
# endpoint) plus the developer tools ([dev]: tests, linters, protoc).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Importing litellm otherwise downloads a model cost map from the network.
export LITELLM_LOCAL_MODEL_COST_MAP := True

REDIS_HOST := 127.0.0.1
REDIS_PORT := 6379
PG_HOST := 127.0.0.1
PG_PORT := 5432

# npm packages (`npm ci`, stamped: rerun only when a package-lock.json changes):
# proto/ holds buf, services/translator_node/ the Node.js agent service.
NODE_DIRS := proto services/translator_node tests/interop/a2a_js
NODE_STAMPS := $(addsuffix /node_modules/.npm-ci.stamp,$(NODE_DIRS))

.PHONY: venv proto proto-check proto-lint node-deps lint services-install services-up test demo bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -e '.[all,dev]'
	touch $@

proto: venv
	$(PY) proto/generate.py

proto-check: venv
	$(PY) proto/generate.py --check

node-deps: $(NODE_STAMPS)

# Without npm, `make` outside CI says what cannot run; under CI=true it is an error.
%/node_modules/.npm-ci.stamp: %/package-lock.json %/package.json
	@if command -v npm >/dev/null; then \
	  echo "node-deps: npm ci in $*"; \
	  cd $* && npm ci --no-audit --no-fund && touch node_modules/.npm-ci.stamp; \
	elif [ "$${CI:-}" = true ]; then \
	  echo "node-deps: npm is not installed (needed in $*)" >&2; exit 1; \
	else \
	  echo "node-deps: npm not installed; skipping $* (buf lint and the Node.js interop tests cannot run)"; \
	fi

# buf lint and buf breaking (against the previous commit of main), see proto/check.sh.
proto-lint: node-deps
	@if [ -x proto/node_modules/.bin/buf ] || command -v buf >/dev/null || [ "$${CI:-}" = true ]; then \
	  bash proto/check.sh; \
	else \
	  echo "proto-lint: buf not installed (no npm); skipped"; \
	fi

# Debian's chromium is the browser of the `helix-mesh inspect` page's test (Playwright
# drives it by path; it never downloads a browser of its own).
services-install:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v pg_ctlcluster >/dev/null || missing="$$missing postgresql"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "services-install: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing \
	      || echo "services-install: apt-get could not install$$missing"; \
	  else \
	    echo "services-install: missing$$missing and cannot install (not root or no apt-get)"; \
	  fi; \
	fi

lint: venv proto-lint
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) proto/generate.py --check

# Start local Redis and PostgreSQL unless they already answer, installing them from
# Debian's packages first where they are missing (needs root and apt-get). Failures
# are not an error here: the tests decide (under CI=true an unreachable backend fails).
# This Redis keeps nothing on disk: a store refuses it unless volatile data is allowed
# (HELIX_ALLOW_VOLATILE_STORE=1, which tests/conftest.py and `make bench` set).
services-up: services-install
	@if ! command -v redis-cli >/dev/null || ! command -v redis-server >/dev/null; then \
	  echo "services-up: redis-server/redis-cli not installed; Redis-backed tests cannot reach Redis"; \
	elif redis-cli -h $(REDIS_HOST) -p $(REDIS_PORT) ping >/dev/null 2>&1; then \
	  echo "services-up: Redis answering on $(REDIS_HOST):$(REDIS_PORT)"; \
	else \
	  echo "services-up: starting Redis on $(REDIS_HOST):$(REDIS_PORT)"; \
	  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port $(REDIS_PORT) --save "" \
	    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log \
	    || echo "services-up: redis-server failed to start (see /var/log/redis/ci.log)"; \
	  for _ in $$(seq 50); do \
	    redis-cli -h $(REDIS_HOST) -p $(REDIS_PORT) ping >/dev/null 2>&1 && break; sleep 0.1; \
	  done; \
	  redis-cli -h $(REDIS_HOST) -p $(REDIS_PORT) ping >/dev/null 2>&1 \
	    || echo "services-up: Redis still not answering on $(REDIS_HOST):$(REDIS_PORT)"; \
	fi
	@if ! command -v pg_isready >/dev/null || ! command -v pg_ctlcluster >/dev/null; then \
	  echo "services-up: pg_isready/pg_ctlcluster not installed; PostgreSQL-backed tests cannot reach PostgreSQL"; \
	elif pg_isready -q -h $(PG_HOST) -p $(PG_PORT); then \
	  echo "services-up: PostgreSQL answering on $(PG_HOST):$(PG_PORT)"; \
	elif [ -z "$$(ls /etc/postgresql 2>/dev/null)" ]; then \
	  echo "services-up: no cluster under /etc/postgresql; PostgreSQL-backed tests cannot reach PostgreSQL"; \
	else \
	  echo "services-up: starting PostgreSQL on $(PG_HOST):$(PG_PORT)"; \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -n1) main start \
	    || echo "services-up: pg_ctlcluster failed to start the cluster"; \
	  pg_isready -q -h $(PG_HOST) -p $(PG_PORT) -t 10 \
	    || echo "services-up: PostgreSQL still not answering on $(PG_HOST):$(PG_PORT)"; \
	fi

test: venv services-up node-deps lint
	$(PY) -m pytest -q -n 2 --durations=20

demo: venv
	$(PY) -m services.demo

bench: venv
	HELIX_ALLOW_VOLATILE_STORE=1 $(PY) -m helix_transport.cli bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
