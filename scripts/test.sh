#!/usr/bin/env bash
# The test commands (README, DEVELOPERS.md):
#   bash scripts/test.sh          lint, type-check, then the whole test suite (what .ci/run runs) in
#                                 two parts, one after the other: every test needing no engine, Slurm
#                                 or network on pytest-xdist workers, then the engine tests (marked
#                                 docker, slurm or network); each part prints its slowest tests, and
#                                 a failure in either fails the run. With a second Docker engine
#                                 (scripts/second-engine.sh; .ci/run starts one) the engine tests
#                                 run as two processes side by side, one per engine
#   bash scripts/test.sh --quick  lint, type-check, then the first part alone: minutes, for every
#                                 change; the whole suite before a merge
# Further arguments go to pytest, in both parts (a file, -k EXPR, -x ...); with any, the engine
# tests run in one process. ENVBUILD_TEST_WORKERS sets the workers' count (default: one per core);
# ENVBUILD_TEST_REPORTS=DIR has each part write its JUnit XML report there (part-1.xml, part-2.xml
# and, with a second engine, part-2b.xml: bench/bench_tests.py reads them). ENVBUILD_TEST_ENGINE_2
# is the second engine's DOCKER_HOST (default: scripts/second-engine.sh's socket, used where it
# answers; "none": one process); set to one that does not answer, the run stops (exit 2).
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
# The whole suite. The tests needing no engine are independent of each other (DEVELOPERS.md): on
# the workers, first, so that a broken change fails in minutes. The engine tests check what an
# engine holds (its containers, the images a module left), so two processes never share one:
# with a second engine, half of them run there beside the other half (each process starts its
# own registry and Slurm daemons on free ports); else all in one process. pytest's exit code 5
# (no test selected) is no failure of a part when the other part ran tests (a file with engine
# tests only, a -k naming one).
echo "scripts/test.sh: part 1 of 2: the tests needing no engine, Slurm or network (pytest-xdist)"
first=0
python -m pytest -q "${workers[@]}" -m "$without_engine" --durations=25 "${report1[@]}" "$@" || first=$?
with_engine='docker or slurm or network'
# The engine tests that must share the default engine: buildah keeps one image store per machine,
# not per engine, and these modules count and remove what their builds left there; and
# test_docker_e2e, which could run on either, here so that the two halves take about as long
# (16 min 20 s and 15 min 51 s measured). The rest run on the second.
on_first_engine=(tests/test_lock_e2e.py tests/test_docker_builders.py tests/test_arm64_emulated_e2e.py
                 tests/test_docker_e2e.py)
engine2="${ENVBUILD_TEST_ENGINE_2:-unix:///run/envbuild-engine-2/docker.sock}"
split=0
if [ "$#" -eq 0 ] && [ "$engine2" != none ]; then
  if DOCKER_HOST="$engine2" docker info >/dev/null 2>&1; then
    split=1
  elif [ -n "${ENVBUILD_TEST_ENGINE_2:-}" ]; then
    echo "scripts/test.sh: error: no Docker engine answers at ENVBUILD_TEST_ENGINE_2=$engine2" \
         "(hint: bash scripts/second-engine.sh starts one; ENVBUILD_TEST_ENGINE_2=none runs the" \
         "engine tests in one process)" >&2
    exit 2
  fi
fi
second=0 third=0
if [ "$split" -eq 0 ]; then
  echo "scripts/test.sh: part 2 of 2: the tests marked docker, slurm or network (one process)"
  python -m pytest -q -m "$with_engine" --durations=25 "${report2[@]}" "$@" || second=$?
else
  echo "scripts/test.sh: part 2 of 2: the tests marked docker, slurm or network, two processes" \
       "side by side: ${on_first_engine[*]} on the default engine, the rest on $engine2"
  # The second engine starts with the base images the tests build on (debootstrapped once, for
  # the default engine): copied where it lacks them or holds another image under the tag.
  for image in $(docker images --format '{{.Repository}}:{{.Tag}}' envbuild-test/bookworm); do
    if [ "$(docker image inspect --format '{{.Id}}' "$image")" != \
         "$(DOCKER_HOST="$engine2" docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)" ]; then
      docker save "$image" | DOCKER_HOST="$engine2" docker load >/dev/null
    fi
  done
  ignored=()
  for module in "${on_first_engine[@]}"; do ignored+=("--ignore=$module"); done
  report2b=()
  if [ -n "${ENVBUILD_TEST_REPORTS:-}" ]; then report2b=("--junitxml=$ENVBUILD_TEST_REPORTS/part-2b.xml"); fi
  log2b="$(mktemp "${TMPDIR:-/tmp}/envbuild-part-2b.XXXXXX")"
  echo "scripts/test.sh: the second engine's half writes to $log2b (printed, then removed, when both end)"
  DOCKER_HOST="$engine2" PYTHONUNBUFFERED=1 python -m pytest -q -m "$with_engine" --durations=25 "${report2b[@]}" \
    "${ignored[@]}" >"$log2b" 2>&1 &
  half=$!
  trap 'kill "$half" 2>/dev/null || true' EXIT
  python -m pytest -q -m "$with_engine" --durations=25 "${report2[@]}" "${on_first_engine[@]}" || second=$?
  wait "$half" || third=$?
  trap - EXIT
  echo "scripts/test.sh: part 2, the second engine's half ($engine2):"
  cat "$log2b" && rm -f "$log2b"
fi
halves="$second"
if [ "$split" -eq 1 ]; then halves="$second (default engine) and $third (second engine)"; fi
echo "scripts/test.sh: part 1 exit code $first, part 2 exit code $halves (0: passed, 5: no test selected)"
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ] && { [ "$split" -eq 0 ] || [ "$third" -eq 5 ]; }; then exit 5; fi
for code in "$first" "$second" "$third"; do
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
done
exit 0
