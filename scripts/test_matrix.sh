#!/usr/bin/env bash
# The unit and integration suites against several LiteLLM releases (default: the supported floor,
# a middle release and the newest allowed), each in its own venv under .matrix/ that holds only
# that litellm (installed --no-deps) in front of .venv's packages (scripts/setup.sh first), so a
# leg costs one wheel download and the suites' run time.
#   scripts/test_matrix.sh                      floor, middle and newest
#   scripts/test_matrix.sh 1.105.7 1.110.2      these releases
#   MATRIX_SUITES="tests/unit" scripts/test_matrix.sh   another selection of tests
#   LANGCHAIN_CORE=1.6.1 scripts/test_matrix.sh        also a leg with langchain-core's floor
#   scripts/test_matrix.sh --beside-newest      the floors and the middle release: what CI adds to
#                                               scripts/test.sh's own run on the newest releases
# Tests that need a LiteLLM capability the release lacks skip naming it; nothing else skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"

# The floors are pyproject.toml's; the middle release is one a user of the range still runs.
floor_of() { sed -n "s/^ *\"$1>=\([0-9.]*\),.*/\1/p" pyproject.toml | head -1; }
FLOOR=$(floor_of litellm)
MIDDLE=1.108.14
if [ "${1:-}" = --beside-newest ]; then
  versions=("$FLOOR" "$MIDDLE")
  LANGCHAIN_CORE=${LANGCHAIN_CORE:-$(floor_of langchain-core)}
elif [ "$#" -gt 0 ]; then
  versions=("$@")
else
  newest=$(.venv/bin/python -m pip index versions litellm 2>/dev/null \
    | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' \
    | grep -E '^1\.[0-9]+\.[0-9]+$' | head -1 || true)
  versions=("$FLOOR" "$MIDDLE" "${newest:-$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("litellm"))')}")
fi
suites=${MATRIX_SUITES:-"tests/unit tests/integration"}
base=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

leg() {  # leg NAME PACKAGE==VERSION...: a venv with those packages in front of .venv's
  local name=$1 dir=.matrix/$1
  shift
  if [ ! -x "$dir/bin/python" ]; then
    .venv/bin/python -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --no-deps "$@"
    local site
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$base')" > "$site/zz_base.pth"
    # the CLI tests run the console script: this leg's, on this leg's LiteLLM
    printf '#!/bin/sh\nexec "%s" -c "import sys; from llm_resilience_plugin.cli import main; sys.exit(main())" "$@"\n' \
      "$PWD/$dir/bin/python" > "$dir/bin/llm-resilience"
    chmod +x "$dir/bin/llm-resilience"
  fi
  echo "== $name: $*"
  # shellcheck disable=SC2086
  local workers=${LLM_TEST_WORKERS:-2} parallel=()
  if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
  "$dir/bin/python" -m pytest -q -p no:cacheprovider -rfEs "${parallel[@]}" $suites || failed+=("$name")
}

failed=()
for v in "${versions[@]}"; do
  leg "litellm-$v" "litellm==$v"
done
if [ -n "${LANGCHAIN_CORE:-}" ]; then
  suites=${MATRIX_SUITES:-"tests/unit tests/langchain"}
  # the LangChain packages the suites import, at the newest release that takes this langchain-core
  # (.venv's langchain and langchain-openai need a newer one): pip's resolver picks them, nothing installed
  report=$(mktemp)
  .venv/bin/python -m pip install --quiet --dry-run --ignore-installed --report "$report" \
    "langchain-core==$LANGCHAIN_CORE" "langchain<2" "langchain-openai<2" "langchain-litellm<0.12" \
    "langchain-tests<1.2" "langgraph<2" >/dev/null
  mapfile -t lc < <(.venv/bin/python -c 'import json, sys
for i in json.load(open(sys.argv[1]))["install"]:
    m = i["metadata"]
    if m["name"].startswith(("langchain", "langgraph")):
        print(m["name"] + "==" + m["version"])' "$report")
  rm -f "$report"
  leg "langchain-core-$LANGCHAIN_CORE" "${lc[@]}"
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "matrix: failed on ${failed[*]}" >&2
  exit 1
fi
echo "matrix: passed on ${versions[*]}${LANGCHAIN_CORE:+ and langchain-core $LANGCHAIN_CORE}"
