#!/usr/bin/env bash
# Create .venv (if missing) and install the package with its dev, redis and notebook extras.
# Idempotent: re-running only installs what changed. Needs python3 >= 3.11 and PyPI access.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev,redis,notebooks]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
# Redis-backed tests start a real redis-server themselves; install it if this machine lacks it.
if ! command -v redis-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null 2>&1 \
      || echo "setup: could not install redis-server; Redis tests will be skipped" >&2
  else
    echo "setup: redis-server not found; install it to run the Redis tests" >&2
  fi
fi
