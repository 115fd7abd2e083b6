# The two commands a newcomer needs; each one sets up its environment first (seconds when done).
# PROFILE picks the stack: classic (the default: Python 3.11, TensorFlow 2.15, Horovod,
# Petastorm, PyTorch's CPU build) or current (Python 3.13, the newest TensorFlow with tf-keras,
# numpy 2, pyarrow 18+; engine tf_collective): `make run PROFILE=current`. Each profile installs
# its lock, requirements/<profile>.txt, with uv; `make lock` compiles the locks again.
.PHONY: setup setup-all run lint test test-classic test-current test-fast lock image

PROFILE ?= classic
VENV_classic := .venv
VENV_current := .venv-current
VENV := $(VENV_$(PROFILE))
# pytest-xdist workers for the suite (each with its own session servers and Spark).
WORKERS ?= 2
# Every folder of Python code in the checkout (compiled before the suite runs).
CODE := hvdflow infra training tasks flows bench serving tests

setup:
	bash scripts/setup.sh $(PROFILE)

# The environments `make test` uses: classic, current, Airflow's own (the Airflow tests) and the
# thin Spark Connect workers' (client for current's executors, client-classic for classic's).
setup-all:
	bash scripts/setup.sh classic
	bash scripts/setup.sh current
	bash scripts/setup.sh airflow
	bash scripts/setup.sh client
	bash scripts/setup.sh client-classic

# The main job, end to end, on the embedded defaults.
run: setup
	$(VENV)/bin/hvdflow run

# The test suite: lint, every test once under classic (slow ones included), then under current
# the tests whose code depends on the stack (marked `current`) and an import of every module.
# Fails when no test ran.
test: setup-all lint test-classic test-current

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# Bytecode for the checkout's own modules first: an editable install is never compiled, and
# under PYTHONDONTWRITEBYTECODE each of the suite's ~600 Python processes compiled what it imported.
test-classic:
	bash scripts/test-tools.sh
	bash scripts/setup.sh classic
	@# Docker's engine for tests/container; where it cannot be installed, those tests say why.
	-bash scripts/setup.sh docker
	bash scripts/setup.sh airflow
	bash scripts/setup.sh client-classic
	.venv/bin/python -m compileall -q $(CODE)
	.venv/bin/python -m pytest -n $(WORKERS) --durations=25 $(PYTEST_ARGS)

test-current:
	bash scripts/setup.sh current
	bash scripts/setup.sh client
	.venv-current/bin/python -m compileall -q $(CODE)
	.venv-current/bin/python -m pytest -n $(WORKERS) --durations=15 -m current $(PYTEST_ARGS)

# The unit tier alone (no JVM, server or subprocess): under a minute, for the edit-test loop.
test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -m unit $(PYTEST_ARGS)

# Compile every profile's lock again from pyproject.toml (UPGRADE=1: the newest that resolves).
lock:
	bash scripts/lock.sh

# The container image of a profile, hvdflow:$(PROFILE) (container/Dockerfile): every role runs
# from it. Debian's Docker engine and debootstrap are installed first where they are missing.
image: setup
	bash scripts/setup.sh docker
	IMAGE_PYTHON=$(VENV)/bin/python bash scripts/image.sh $(PROFILE)
