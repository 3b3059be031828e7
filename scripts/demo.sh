#!/usr/bin/env bash
# One command: install what the demo needs (only that), then run it against the built-in
# simulated providers. Extra arguments go to the demo, e.g. scripts/demo.sh --calls 4
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/llm-resilience demo "$@"
