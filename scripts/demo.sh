#!/usr/bin/env bash
# One command: set everything up, then run the demo against the built-in simulated providers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/llm-resilience demo "$@"
