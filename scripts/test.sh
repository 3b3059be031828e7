#!/usr/bin/env bash
# One command: set everything up, then lint, type-check, build the docs and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
.venv/bin/ruff check llm_resilience_plugin tests benchmarks
.venv/bin/ruff format --check llm_resilience_plugin tests benchmarks
.venv/bin/mypy llm_resilience_plugin
.venv/bin/lint-imports --no-cache
# The documentation site must build with no warning (broken links, API docs that no longer resolve).
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# A line per test file with the count done so far ([ 812/1650]), then the 15 slowest tests and
# the time per kind of test (tests/conftest.py): the suite takes about 12 minutes on 2 cores.
# Opt-in: LITELLM_MATRIX="1.109.3 1.110.0" then runs the unit and integration suites against
# those LiteLLM releases too (scripts/test_matrix.sh; ~6-10 min a release on 2 cores).
if [ -n "${LITELLM_MATRIX:-}" ]; then
  .venv/bin/pytest -p no:cacheprovider -o console_output_style=count --durations=15 "$@"
  # shellcheck disable=SC2086
  exec bash scripts/test_matrix.sh $LITELLM_MATRIX
fi
exec .venv/bin/pytest -p no:cacheprovider -o console_output_style=count --durations=15 "$@"
