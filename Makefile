# The two commands a newcomer needs; each one sets up .venv first (fast when already done).
.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

# The main job, end to end, on the embedded defaults.
run: setup
	.venv/bin/hvdflow run

# The test suite: lint, then every test (slow ones included). Fails when no test ran.
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python -m pytest $(PYTEST_ARGS)
