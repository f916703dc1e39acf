# perdure developer entry points. `make` alone creates .venv and installs
# perdure into it (editable, with the dev extras); every target below uses it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base
PYTEST_ARGS ?=

.DEFAULT_GOAL := install
.PHONY: install system-packages demo demo-crash test test-fast smoke-installed docs soak bench bench-peers server-start server-stop histories clean distclean

install: $(STAMP) system-packages

# System packages that features need: bubblewrap (`bwrap`, the sandbox every shell
# command runs in), chromium (headless, for the browser tests of the UI) and strace
# (`make bench-peers` counts each system's fsyncs with it). Installed
# with apt when this runs as root on Debian/Ubuntu; otherwise it says what to install.
SYSTEM_PACKAGES := bwrap:bubblewrap chromium:chromium strace:strace
system-packages:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || { \
	      apt-get update -q >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; } || \
	      echo "warning: could not install$$missing; install them yourself (apt-get install$$missing)" >&2; \
	  else \
	    echo "note: perdure wants$$missing: run 'sudo apt-get install$$missing' (see README.md, Two commands)" >&2; \
	  fi; \
	fi

# The venv, created with $(PYTHON) when it does not exist; refused when its Python is older than 3.11.
define ensure_venv
	@if [ ! -x $(BIN)/python ]; then \
	  $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	    echo "error: perdure needs Python >= 3.11, but PYTHON=$(PYTHON) is: $$($(PYTHON) --version 2>&1)" >&2; \
	    echo "       run: make PYTHON=/path/to/python3.11 (or newer)" >&2; \
	    exit 1; }; \
	  echo "creating $(VENV) with $(PYTHON)"; \
	  $(PYTHON) -m venv $(VENV); \
	fi
	@$(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "error: $(VENV) runs $$($(BIN)/python --version 2>&1); perdure needs >= 3.11" >&2; \
	  echo "       run: make distclean && make PYTHON=/path/to/python3.11" >&2; \
	  exit 1; }
endef

# Redone whenever pyproject.toml changes (a new dependency or entry point). The paid-generation
# example is installed beside perdure (never into its wheel): its tests load its tools through
# its entry point, as any installed distribution's.
EXAMPLE := examples/paid-generation
$(STAMP): pyproject.toml setup.py $(EXAMPLE)/pyproject.toml
	$(ensure_venv)
	$(BIN)/python -m pip install -e '.[dev]' -e $(EXAMPLE)
	@touch $@

# What `make demo` needs: perdure and its runtime dependencies, not the test extras
# (a venv that already has the dev install has them all).
$(BASE_STAMP): pyproject.toml setup.py
	$(ensure_venv)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then :; else $(BIN)/python -m pip install -e .; fi
	@touch $@

demo: $(BASE_STAMP) system-packages
	$(BIN)/perdure demo

# A worker SIGKILLed right after the mail API accepted an email; a new worker
# finishes the goal; the ledgers show each effect once.
demo-crash: $(STAMP) system-packages
	$(BIN)/python -m perdure.starters.demo_crash

# pytest exits with 5 when it collects no tests (an empty suite, or a
# PYTEST_ARGS filter matching nothing). That is not a failure here; make
# would otherwise report any non-zero status as its own exit code 2. Under
# pytest-xdist a test path that does not exist also ends in exit 5, so paths in
# PYTEST_ARGS are checked first: a typo fails instead of passing.
define run_pytest
@for arg in $(PYTEST_ARGS); do case $$arg in tests/*|*.py|*.py::*) path=$${arg%%::*}; \
  [ -e "$$path" ] || { echo "error: $$path (in PYTEST_ARGS) does not exist" >&2; exit 4; };; esac; done; \
$(BIN)/python -m pytest -q $(1) $(PYTEST_ARGS); status=$$?; \
if [ $$status -eq 5 ]; then echo "pytest collected no tests (exit 5); treated as success"; exit 0; fi; \
exit $$status
endef

# The whole suite in two passes: everything but the process tier's timing-sensitive tests,
# TEST_WORKERS at a time (the tests mostly wait on timers, dev servers and subprocesses: the
# whole of make test used about one core of two; on 2 cores five take 243 s where three took
# 301 s), then those two at a time (each has its own dev server and worker processes, and
# races a kill against a heartbeat timeout or waits on a page; three at a time made them
# flaky on 2 cores: two failures in three clean-clone runs). A process test marked
# `parallel_safe` has no such timing and runs in the first pass; a test marked `cpu_heavy`
# (hundreds of nodes in a workflow task, under the SDK's 2 s deadlock check) runs in the second.
TEST_WORKERS ?= 5
PROCESS_WORKERS ?= 2
test: $(STAMP) system-packages
	$(call run_pytest,-m "(not process or parallel_safe) and not cpu_heavy" -n $(TEST_WORKERS))
	$(call run_pytest,-m "(process and not parallel_safe) or cpu_heavy" -n $(PROCESS_WORKERS))

# Everything but the `process` and `slow` tiers (tests that start `perdure worker` or other CLI
# subprocesses, kill processes, start their own dev servers, or soak), TEST_WORKERS at a
# time, each with its own dev servers. The process tier's timing-sensitive kills are
# left to `make test`. Fewer examples per property test (tests/conftest.py); make test
# runs them all.
test-fast: export PERDURE_HYPOTHESIS_PROFILE := fast
test-fast: $(STAMP) system-packages
	$(call run_pytest,-m "not process and not slow" -n $(TEST_WORKERS))

# perdure as a user installs it (tests/smoke_installed.py): the wheel and the sdist built, the
# wheel installed into a fresh venv outside the checkout, and there the dev server, a worker, a
# device, a goal with every node kind, `perdure ui` and `perdure mcp`. About 40 s; .ci/run runs it.
smoke-installed: $(STAMP)
	$(BIN)/python tests/smoke_installed.py

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, a page
# left out of the nav, or a reference page whose code moved fails the build. .ci/run runs it.
# The two variables silence the banners mkdocs' plugins print about MkDocs 2 on every build.
# No --quiet: it hides the warnings --strict counts, and the build then passes a broken link.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict

# Seeded random worker kills across goals with remote effects (own dev server): kills aimed
# at steps, then kills every 2-5 s and during `perdure start` (testing/timed_soak.py), per seed.
# Each soak's last line is `soak: kills=K effects=E duplicates=D missing=M completed=C/T lost_attempts=L`.
SOAK_KILLS ?= 20
SOAK_TIMED_KILLS ?= 25
SOAK_SEEDS ?= 1
soak: $(STAMP) system-packages
	$(BIN)/python -m tests.soak --kills $(SOAK_KILLS) --seeds $(SOAK_SEEDS)
	$(BIN)/python -m tests.soak --timed --kills $(SOAK_TIMED_KILLS) --seeds $(SOAK_SEEDS)

bench: $(STAMP) system-packages
	@test -f bench/run.py || { echo "error: bench/run.py does not exist yet" >&2; exit 1; }
	$(BIN)/python bench/run.py

# perdure beside LangGraph (SQLite checkpointer) and DBOS (on SQLite) in one run, on equal
# storage twice (the server on a db file and the peers on the same disk; all in memory), not part
# of `make test` (options: PEERS_ARGS="--n 100 --repeats 1"). The peers live in their own venv, bench/peers/.venv, redone when their
# pinned requirements change: their dependencies never reach perdure's venv.
PEERS := bench/peers
PEERS_STAMP := $(PEERS)/.venv/.installed
PEERS_ARGS ?=
$(PEERS_STAMP): $(PEERS)/requirements.txt
	@test -x $(PEERS)/.venv/bin/python || $(BIN)/python -m venv $(PEERS)/.venv
	$(PEERS)/.venv/bin/python -m pip install -q -r $(PEERS)/requirements.txt
	@touch $@

bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python -m bench.peers_run $(PEERS_ARGS)

# perdure alone, as for the demo: stopping the server `make demo` left needs no test extras.
server-start: $(BASE_STAMP)
	$(BIN)/perdure server start

server-stop: $(BASE_STAMP)
	$(BIN)/perdure server stop

histories: $(STAMP) system-packages
	$(BIN)/python -m tests.record_histories

# Never touches temporal-dev/data: that is the dev server's database (your goals).
clean:
	rm -rf build dist .pytest_cache .hypothesis *.egg-info bench/out
	find . \( -path ./$(VENV) -o -path ./$(PEERS)/.venv \) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(PEERS)/.venv
