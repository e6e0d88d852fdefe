#!/usr/bin/env bash
# The test commands (README, DEVELOPERS.md):
#   bash scripts/test.sh          lint, type-check, then the whole test suite (what .ci/run runs),
#                                 printing the 25 slowest tests at the end
#   bash scripts/test.sh --quick  lint, type-check, then every test that needs no Docker engine, no
#                                 Slurm and no network, spread over the cores (pytest-xdist):
#                                 minutes, for every change; the whole suite before a merge
# Further arguments go to pytest (a file, -k EXPR, -x ...). ENVBUILD_TEST_WORKERS sets the
# quick tier's worker count (default: one per core).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
ruff check envbuild tests bench
mypy
if [ "$quick" -eq 1 ]; then
  # No engine for this tier (a test asking for one must carry the docker marker: conftest.py
  # refuses to collect it otherwise), so CI's demand for one does not apply.
  unset ENVBUILD_REQUIRE_DOCKER
  workers=(-n "${ENVBUILD_TEST_WORKERS:-auto}")
  if ! python -c 'import xdist' 2>/dev/null; then
    echo "scripts/test.sh: pytest-xdist is not installed (pip install -e '.[test]'): one process" >&2
    workers=()
  fi
  exec python -m pytest -q "${workers[@]}" -m "not docker and not slurm and not network" --durations=10 "$@"
fi
exec python -m pytest -q --durations=25 "$@"
