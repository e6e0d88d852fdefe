#!/usr/bin/env bash
# The test commands (README, DEVELOPERS.md):
#   bash scripts/test.sh          lint, type-check, then the whole test suite (what .ci/run runs) in
#                                 two parts, one after the other: every test needing no engine, Slurm
#                                 or network on pytest-xdist workers, then the engine tests (marked
#                                 docker, slurm or network) in one process; each part prints its
#                                 slowest tests, and a failure in either fails the run
#   bash scripts/test.sh --quick  lint, type-check, then the first part alone: minutes, for every
#                                 change; the whole suite before a merge
# Further arguments go to pytest, in both parts (a file, -k EXPR, -x ...). ENVBUILD_TEST_WORKERS
# sets the workers' count (default: one per core); ENVBUILD_TEST_REPORTS=DIR has each part write
# its JUnit XML report there (part-1.xml, part-2.xml: bench/bench_tests.py reads them).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
ruff check envbuild tests bench
mypy
workers=(-n "${ENVBUILD_TEST_WORKERS:-auto}")
if ! python -c 'import xdist' 2>/dev/null; then
  echo "scripts/test.sh: pytest-xdist is not installed (pip install -e '.[test]'): one process" >&2
  workers=()
fi
without_engine='not docker and not slurm and not network'
report1=() report2=()
if [ -n "${ENVBUILD_TEST_REPORTS:-}" ]; then
  report1=("--junitxml=$ENVBUILD_TEST_REPORTS/part-1.xml") report2=("--junitxml=$ENVBUILD_TEST_REPORTS/part-2.xml")
fi
if [ "$quick" -eq 1 ]; then
  # No engine for this tier (a test asking for one must carry the docker marker: conftest.py
  # refuses to collect it otherwise), so CI's demand for one does not apply.
  unset ENVBUILD_REQUIRE_DOCKER
  exec python -m pytest -q "${workers[@]}" -m "$without_engine" --durations=10 "${report1[@]}" "$@"
fi
# The whole suite. The engine tests share one engine, one registry and Slurm daemons, and some
# time how long a build is let run: one process, alone on the machine, as before. The rest are
# independent of each other (DEVELOPERS.md): on the workers, first, so that a broken change
# fails in minutes. pytest's exit code 5 (no test selected) is no failure of a part when the
# other part ran tests (a file with engine tests only, a -k naming one).
echo "scripts/test.sh: part 1 of 2: the tests needing no engine, Slurm or network (pytest-xdist)"
first=0
python -m pytest -q "${workers[@]}" -m "$without_engine" --durations=25 "${report1[@]}" "$@" || first=$?
echo "scripts/test.sh: part 2 of 2: the tests marked docker, slurm or network (one process)"
second=0
python -m pytest -q -m "docker or slurm or network" --durations=25 "${report2[@]}" "$@" || second=$?
echo "scripts/test.sh: part 1 exit code $first, part 2 exit code $second (0: passed, 5: no test selected)"
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then exit 5; fi
for code in "$first" "$second"; do
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
done
exit 0
