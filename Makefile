# The two commands of the README: `make serve` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.shoal-installed
REPO ?= model_repository
HTTP_PORT ?= 8000
SERVE_FLAGS ?=

.PHONY: serve compile test check lint typecheck unit integration protos bench-ipc bench-compare clean

# `make serve` installs what serving needs: shoal's runtime dependencies (RUNTIME), then the
# framework extras (onnx, torch) only when a model of $(REPO) uses that backend.
RUNTIME := $(VENV)/.shoal-runtime
# These installs build in pip's isolated environment, where mypyc is not: they install shoal
# interpreted whatever SHOAL_REQUIRE_COMPILED says (.ci/run sets it for the compiled build below).
NO_REQUIRE := env -u SHOAL_REQUIRE_COMPILED

$(RUNTIME): setup.cfg pyproject.toml setup.py
	@echo "shoal: installing the runtime dependencies into $(VENV)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(NO_REQUIRE) $(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

# Everything `make test` needs: every extra and the test tools.
$(STAMP): setup.cfg pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch pinned first: the CPU build of this release lies on disk, and the extra's range then
	# admits it instead of pulling a newer multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(NO_REQUIRE) $(BIN)/python -m pip install --quiet -e '.[test,onnx,torch]'
	touch $(STAMP) $(RUNTIME)

# The request hot path compiled with mypyc (setup.py, docs/perf.md), rebuilt when one of its
# sources changes. It needs the dependencies installed first, hence a second, unisolated build.
# Where it cannot be built, shoal runs interpreted.
COMPILED := $(VENV)/.shoal-compiled
HOT_PATH := $(shell sed -n 's/^    "\(shoal\/.*\.py\)",$$/\1/p' shoal/_compiled.py)

$(COMPILED): $(STAMP) setup.py shoal/_compiled.py $(HOT_PATH)
	$(BIN)/python -m pip install --quiet 'setuptools>=68' wheel
	$(BIN)/python -m pip install --quiet --no-build-isolation --no-deps -e . \
		|| echo "shoal: the build above failed; shoal runs interpreted"
	@# pip --quiet hides a mypyc failure (setup.py then installs interpreted): say what was built.
	@$(BIN)/python -c "import shoal._compiled as c; print('shoal: request hot path', c.state)"
	touch $(COMPILED)

serve: $(RUNTIME)
	@extras=$$($(BIN)/python scripts/repository_extras.py $(REPO)) || exit 1; \
	if [ -n "$$extras" ]; then \
		echo "shoal: $(REPO) has models that need the extras [$$extras]: installing them"; \
		$(BIN)/python -m pip install --quiet -e ".[$$extras]" || exit 1; \
	fi
	$(BIN)/shoal serve --model-repository $(REPO) --http-port $(HTTP_PORT) $(SERVE_FLAGS)

# The compiled hot path for `make serve` too (it needs mypy: the test extra).
compile: $(COMPILED)

test: check

check: lint typecheck $(COMPILED)
	$(BIN)/python -m pytest -q

LINTED := $(wildcard shoal tests benchmarks scripts setup.py)

lint: $(STAMP)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(COMPILED)
	$(BIN)/python -m pytest -q tests/unit

integration: $(COMPILED)
	$(BIN)/python -m pytest -q tests/integration

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

bench-ipc: $(COMPILED)
	$(BIN)/python -m benchmarks.ipc

bench-compare: $(COMPILED)
	$(BIN)/python -m benchmarks.compare

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find shoal -name '*.so' -delete
