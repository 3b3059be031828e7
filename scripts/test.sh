#!/usr/bin/env bash
# One command: set everything up, then lint, type-check, build the docs and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
.venv/bin/ruff check llm_resilience_plugin tests benchmarks
.venv/bin/ruff format --check llm_resilience_plugin tests benchmarks

# mypy, the import contracts and the documentation site (it must build with no warning: broken
# links, API docs that no longer resolve) run in the background while the tests run: the tests
# mostly wait on sockets and subprocesses, so the cores have room. Their output is printed after
# the tests, and any of them failing fails the script.
checks_log=$(mktemp)
(
  set -e
  .venv/bin/mypy llm_resilience_plugin
  .venv/bin/lint-imports --no-cache
  NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
) >"$checks_log" 2>&1 &
checks=$!

# The tests run on 2 pytest-xdist workers (-n 2; LLM_TEST_WORKERS=N for another count, 0 for none;
# 4 on 2 cores starved timing-sensitive tests): a line per test file when its last test is done,
# with the count done so far ([ 812/2218]), then the 15 slowest tests and the time per kind of test
# (tests/conftest.py). The whole script takes under 5 minutes on 2 cores from a fresh clone (setup
# included; about 4 once .venv exists): examples and CLI runs fork from a preloaded forkserver
# (tests/_forked.py) instead of importing LiteLLM in a fresh interpreter each.
# This run is on the newest releases setup installs. LLM_TEST_MATRIX=1 (set by .ci/run) then runs
# the unit and integration suites on LiteLLM's floor and a middle release, and the unit and
# LangChain suites on langchain-core's floor (scripts/test_matrix.sh --beside-newest; about 7 more
# minutes on 2 cores). LITELLM_MATRIX="1.106.12 1.109.3" runs those releases instead.
workers=${LLM_TEST_WORKERS:-2}
parallel=()
# --no-loadscope-reorder: files go in the order tests/conftest.py gives them (slow ones first)
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
status=0
.venv/bin/pytest -p no:cacheprovider -o console_output_style=count --durations=15 "${parallel[@]}" "$@" ||
  status=$?

checks_status=0
wait "$checks" || checks_status=$?
echo "--- mypy, lint-imports, mkdocs build --strict (run beside the tests; exit $checks_status):"
cat "$checks_log"
rm -f "$checks_log"
[ "$checks_status" = 0 ] || exit "$checks_status"
[ "$status" = 0 ] || exit "$status"
if [ -n "${LITELLM_MATRIX:-}" ]; then
  # shellcheck disable=SC2086
  exec bash scripts/test_matrix.sh $LITELLM_MATRIX
elif [ "${LLM_TEST_MATRIX:-0}" != 0 ]; then
  exec bash scripts/test_matrix.sh --beside-newest
fi
