#!/usr/bin/env bash
# The test command (README): lint, type-check, then the whole test suite.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ruff check envbuild tests bench
mypy
python -m pytest -q "$@"
