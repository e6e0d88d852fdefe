#!/usr/bin/env bash
# A second Docker engine on this machine, for the whole test suite's engine part (scripts/test.sh
# runs half of the engine tests on it, beside the other half on the default engine): its own
# socket, data root and exec root, so that the two halves never see each other's images and
# containers, and each half's clean-up removes only its own. No bridge network and no iptables,
# like the first (.ci/run). Needs root (or sudo) and dockerd; prints the DOCKER_HOST to use.
# Idempotent: an engine already answering there is left as it is.
#   bash scripts/second-engine.sh            start it (if needed), print its DOCKER_HOST
#   bash scripts/second-engine.sh --stop     stop it (its data root stays, for the next start)
set -Eeuo pipefail
root_dir="${ENVBUILD_ENGINE_2_ROOT:-/var/lib/envbuild-engine-2}"
run_dir="${ENVBUILD_ENGINE_2_RUN:-/run/envbuild-engine-2}"
host="unix://$run_dir/docker.sock"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ "${1:-}" = "--stop" ]; then
  if [ -f "$run_dir/dockerd.pid" ]; then
    $SUDO kill "$(cat "$run_dir/dockerd.pid")" 2>/dev/null || true
  fi
  exit 0
fi
if DOCKER_HOST="$host" docker info >/dev/null 2>&1; then
  echo "$host"
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "scripts/second-engine.sh: no dockerd on PATH (apt-get install docker.io)" >&2
  exit 1
fi
$SUDO mkdir -p "$root_dir" "$run_dir"
log="$run_dir/dockerd.log"
$SUDO sh -c "nohup dockerd --data-root '$root_dir' --exec-root '$run_dir/exec' \
  --pidfile '$run_dir/dockerd.pid' -H '$host' --bridge=none --iptables=false --ip6tables=false \
  >'$log' 2>&1 &"
for _ in $(seq 1 60); do
  if DOCKER_HOST="$host" docker info >/dev/null 2>&1; then
    echo "$host"
    exit 0
  fi
  sleep 1
done
echo "scripts/second-engine.sh: the second engine did not answer at $host within 60 s; its log:" >&2
$SUDO tail -20 "$log" >&2 || true
exit 1
