# The two commands of the README: `make run` and `make test`.
# Everything they need is installed here, into .venv, from a Python >= 3.12 that
# scripts/find-python locates (or explains how to install).
VENV      := .venv
PY        := $(VENV)/bin/python
STATE     := .state
LISTEN    ?= 127.0.0.1:8080
RULES     ?= rules/example.yaml
PYTEST_ARGS ?=
# pytest-xdist workers: two by default (the e2e tier mostly waits on subprocesses); each module, and
# every network-namespace module together, runs in one worker (tests/conftest.py's scheduler); the
# canary scan covers every worker. PYTEST_WORKERS= (empty) runs the suite in one process.
PYTEST_WORKERS ?= 2

.PHONY: run test venv demo-setup bench clean

$(VENV)/.installed: pyproject.toml
	@PYBIN=$$(scripts/find-python) || exit 1; \
	  [ -x $(PY) ] || $$PYBIN -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

# Creates what the example rules read: the demo claim's proxy token and the demo
# credential's value (a fake token), each 0600, only if absent; then the CA.
demo-setup: venv
	@mkdir -p $(STATE) && chmod 700 $(STATE)
	@$(PY) -m proxy demo init --state-dir $(STATE)

run: demo-setup
	$(PY) -m proxy run --rules $(RULES) --state-dir $(STATE) --listen $(LISTEN)

# All checks, in the order a failure is cheapest to read: lint, types, then the suite.
test: venv
	$(PY) -m ruff check proxy addons certs tests bench
	$(PY) -m mypy
	$(PY) -m pytest $(if $(PYTEST_WORKERS),-n $(PYTEST_WORKERS)) $(PYTEST_ARGS)

# Issue 7's benchmark (~5 min; BENCH_ARGS=--quick for a ~1 min smoke run). It needs nginx and hey
# from apt: installed here when missing, which needs root.
bench: venv
	@missing=""; \
	  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	  command -v hey >/dev/null || missing="$$missing hey"; \
	  if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" -ne 0 ]; then \
	      echo "make bench needs$$missing: run it as root, or first: sudo apt-get install -y$$missing" >&2; \
	      exit 1; \
	    fi; \
	    echo "installing$$missing (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing; \
	  fi
	$(PY) bench/run.py $(BENCH_ARGS)


clean:
	rm -rf $(VENV) $(STATE)
