# `make demo` and `make test` work on a fresh machine with only Python 3.11, 3.12 or 3.13: they create a virtual
# environment and install every dependency pinned by requirements.lock before doing their job. PYTHON (or PY) picks
# the interpreter (`make test PYTHON=python3.13`); each minor version gets its own environment (.venv for 3.11,
# .venv-3.12, .venv-3.13), so one checkout holds them side by side. VENV=DIR names another.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PY ?= $(PYTHON)
PY_VERSION := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV ?= $(if $(filter 3.11,$(PY_VERSION)),.venv,.venv-$(PY_VERSION))
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := out/demo
# Python caches compiled modules (and pytest its rewritten test modules) in __pycache__/ unless the shell says not
# to: a shell with PYTHONDONTWRITEBYTECODE set compiled every module of pexec again in each of the suite's hundreds
# of processes (the test collection alone: 11 s of CPU per worker instead of 7).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install servers demo check test smoke lint typecheck docs docs-serve reference browser bench fuzz lock clean \
	image mlflow-server phoenix-server trace-servers trace-servers-stop

# The official simulators are pinned in specs/simulators.txt (installed without their declared model-client
# dependencies) and specs/simulator-wheels.txt (releases read from their wheel). The trace servers of the MLflow
# and Phoenix round-trip tests run from environments of their own, $(VENV)/servers/<name>, each pinned whole by
# tests/servers/<name>.txt (tests/trace_servers.py says why).
# They are built only by what runs them (`make test`, `make servers`, `make mlflow-server`, `make phoenix-server`),
# never by `make install` or `make demo` (about 1.5 GB the demo never uses). Each has a stamp of its own;
# SERVERS= builds none (the 3.13 smoke set in CI needs none).
SERVERS ?= mlflow phoenix
# Packages are installed by uv (itself pinned, installed by pip first): the same pins as pip would take, in a
# fraction of the time, with every module compiled to bytecode at install as pip does.
UV_VERSION := 0.13.9
UV = $(BIN)/uv pip install --quiet --compile-bytecode --python  # then the interpreter to install for
$(STAMP): pyproject.toml requirements.lock specs/simulators.txt specs/simulator-wheels.txt
	@$(PY) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13), "Python 3.11, 3.12 or 3.13 is required"' \
		|| { echo "$(PY) does not run Python 3.11-3.13 (make ... PYTHON=python3.13 picks another)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3" "uv==$(UV_VERSION)"
	$(UV) $(BIN)/python -c requirements.lock -e ".[dev,sims]"
	$(UV) $(BIN)/python --no-deps -c requirements.lock -r specs/simulators.txt
	$(BIN)/python -m pip download --quiet --no-deps -d $(VENV)/bfcl-data -r specs/simulator-wheels.txt
	touch $(STAMP)

$(VENV)/servers/%/.installed-stamp: tests/servers/%.txt $(STAMP)
	test -x $(VENV)/servers/$*/bin/python || $(PY) -m venv --without-pip $(VENV)/servers/$*
	$(UV) $(VENV)/servers/$*/bin/python --no-deps -r $<
	touch $@

install: $(STAMP)

servers: $(SERVERS:%=$(VENV)/servers/%/.installed-stamp)

# The trace stores of the MLflow and Phoenix guides, the same pinned servers the tests run, in the background on
# 127.0.0.1 (MLflow :5000, Phoenix :6006; their data and logs under out/servers/), until `make trace-servers-stop`
# (or infra/local/serve.sh stop NAME). Each start waits until its server answers.
mlflow-server: $(VENV)/servers/mlflow/.installed-stamp
	@infra/local/serve.sh start mlflow

phoenix-server: $(VENV)/servers/phoenix/.installed-stamp
	@infra/local/serve.sh start phoenix

trace-servers: mlflow-server phoenix-server

trace-servers-stop:
	@infra/local/serve.sh stop mlflow
	@infra/local/serve.sh stop phoenix

# τ³ banking_knowledge is replayed against upstream tau2-bench's own code, which needs Python >= 3.12: its test
# (tests/test_tau_banking.py) runs that code in $(VENV)/tau2, pinned whole by tests/tau3_runs/requirements.txt (what
# upstream's runner ran with when it wrote the fixtures). `make test` builds it when a Python 3.12 or 3.13 is found.
TAU2_PY ?= $(shell for p in python3.12 python3.13 $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { command -v $$p; break; }; done)
$(VENV)/tau2/.installed-stamp: tests/tau3_runs/requirements.txt $(STAMP)
	@test -n "$(TAU2_PY)" || { echo "no Python >= 3.12 found (TAU2_PY=...): the banking_knowledge test will skip"; exit 0; }; \
	test -x $(VENV)/tau2/bin/python || $(TAU2_PY) -m venv --without-pip $(VENV)/tau2; \
	$(UV) $(VENV)/tau2/bin/python --no-deps -r $< && touch $@

demo: install
	rm -rf $(DEMO)
	$(BIN)/pexec synth shop --rollouts 4000 --tasks 250 --seed 0 \
	  --out $(DEMO)/store
	$(BIN)/pexec score $(DEMO)/store --out $(DEMO)/run --shard-mb 2
	$(BIN)/pexec metrics $(DEMO)/run --by model,method
	$(BIN)/pexec report $(DEMO)/run --by model,method \
	  --out $(DEMO)/report

lint: install
	$(BIN)/ruff check pipeline tests
	$(BIN)/ruff format --check pipeline tests

# The type checker of `make check` and `make test`: mypy --strict over pipeline/ ([tool.mypy] in pyproject.toml).
typecheck: install
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/) into out/site: strict, so a broken link or anchor, a page missing from
# the nav or any other warning fails the build. Nothing is fetched; a few seconds.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir out/site

# The site served on 127.0.0.1:8000 (DOCS_PORT=…) until Ctrl-C: opened from disk its links work but its search
# does not (browsers start no Web Worker from a file:// page); served, search works too.
DOCS_PORT ?= 8000
docs-serve: docs
	@echo "the documentation at http://127.0.0.1:$(DOCS_PORT)/ (Ctrl-C stops it)"
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory out/site $(DOCS_PORT)

# Rewrite the reference pages' generated blocks from the code (tests/test_docs.py fails while one is stale).
reference: install
	$(BIN)/python -m pipeline.apps.cli.reference

# The report and viewer tests open pages in a real headless browser: Debian's chromium, driven by Playwright
# (pinned in the dev extra) through executable_path, so Playwright never downloads a browser of its own.
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Tests are marked by what they start (pyproject.toml: ray, cluster, server, trace_server, browser, docs, other_python;
# and fuzz, corpus, memory):
# a marker comes from the test, its module or a fixture it uses, and a test that starts Ray, a server process or
# a browser without its marker fails (tests/conftest.py).
# The suite runs on 2 worker processes (pytest-xdist), a test file at a time on one of them: each module's
# fixtures (a scored run, a Ray head, an S3 server) are made once; the longest modules go first
# (tests/conftest.py). The 15 slowest tests are listed at the end.
PYTEST_XDIST := -n 2 --dist loadfile --no-loadscope-reorder --durations=15

# The inner loop, meant to take under 150 s on a 2-core machine from a warm venv (150-169 s at 1,584 tests; 230-280 s at 1,593-1,623 on a slower day): lint, the
# type checker, and every test that starts nothing of the above and is none of the longer suites (fuzz, corpus,
# memory); it ends saying how many tests it ran and how many it left to `make test`.
CHECK_LEAVES := ray or cluster or server or trace_server or browser or docs or other_python or fuzz or corpus or memory
check: lint typecheck
	$(BIN)/pytest $(PYTEST_XDIST) -m "not ($(CHECK_LEAVES))"

# Everything: lint, the type checker, the documentation site and the whole suite (README's test command, CI).
test: lint typecheck docs browser servers $(VENV)/tau2/.installed-stamp
	PEXEC_TAU2_PYTHON=$(abspath $(VENV))/tau2/bin/python $(BIN)/pytest $(PYTEST_XDIST)

# What shows an interpreter works, in a few minutes (CI runs it on 3.13 beside the suite on 3.11): the demo through
# Ray, one real log of each family scored against its simulator (tests/test_smoke.py: the numbers 3.11 gives), the
# Inspect producer and scorer, and the notebook.
SMOKE := tests/test_smoke.py tests/test_producers_inspect.py tests/test_integration_inspect.py tests/test_notebook.py
smoke: demo
	$(BIN)/pytest -q $(SMOKE)

# The adversarial suites (pytest marker `fuzz`) with many more generated inputs than `make test` uses, within
# a bounded time; the tallies they print are the "Hardening" table of docs/reference/limits.md.
FUZZ_EXAMPLES ?= 400
fuzz: install
	PEXEC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) timeout 1800 $(BIN)/pytest -m fuzz -s tests/

# Each bench replaces its own table in the benchmarks page (measure on a quiet machine: the captions say how quiet).
BENCH_PAGE := docs/reference/benchmarks.md
bench: install
	$(BIN)/pexec bench replay --readme $(BENCH_PAGE)
	$(BIN)/pexec bench metrics --readme $(BENCH_PAGE)
	$(BIN)/pexec bench merged --readme $(BENCH_PAGE)
	$(BIN)/pexec bench scale --readme $(BENCH_PAGE)
	$(BIN)/pexec bench guard --readme $(BENCH_PAGE)
	$(BIN)/pexec bench driver --readme $(BENCH_PAGE)
	$(BIN)/pexec bench start --readme $(BENCH_PAGE)
	$(BIN)/pexec bench split --readme $(BENCH_PAGE)
	$(BIN)/pexec bench raw --readme $(BENCH_PAGE)

# The worker image from infra/Dockerfile, built with buildah (a Debian package; no daemon) and smoke-tested
# with `pexec --version` inside (infra/local/build-image.sh). RAY_BASE=debian builds it on a base bootstrapped
# from Debian packages (infra/local/debian-base.sh) where no container registry is reachable.
IMAGE ?= pexec:$(shell git rev-parse --short HEAD 2>/dev/null || echo dev)
RAY_BASE ?=
image:
	infra/local/build-image.sh $(IMAGE) $(RAY_BASE)

# Re-pin after changing dependencies in pyproject.toml.
# Re-pin on Python 3.11: the pins are 3.11's, except rapidfuzz, whose pinned release has no 3.13 wheel (a marker
# pair keeps 3.11 on upstream's pin).
lock: install
	@test "$(PY_VERSION)" = 3.11 || { echo "make lock runs on Python 3.11"; exit 1; }
	$(BIN)/python -m pip freeze --exclude-editable --exclude pexec --exclude uv \
		| sed 's/^rapidfuzz==3.9.3$$/rapidfuzz==3.9.3; python_version < "3.13"\nrapidfuzz==3.9.7; python_version >= "3.13"/' \
		> requirements.lock

clean:
	rm -rf .venv .venv-3.* out .pytest_cache .ruff_cache .hypothesis
