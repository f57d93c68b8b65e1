# The two commands of the README: `make serve` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.shoal-installed
REPO ?= model_repository
HTTP_PORT ?= 8000

.PHONY: serve test check lint typecheck unit integration protos bench-ipc bench-compare clean

$(STAMP): setup.cfg pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch pinned first: the CPU build of this release lies on disk, and the extra's range then
	# admits it instead of pulling a newer multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test,onnx,torch]'
	touch $(STAMP)

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

serve: $(COMPILED)
	$(BIN)/shoal serve --model-repository $(REPO) --http-port $(HTTP_PORT)

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
