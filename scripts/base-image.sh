#!/usr/bin/env bash
# Make the local Debian bookworm base image the Docker tests build on (no registry is reachable
# from CI): debootstrap a minimal root, then 'docker import' it. Reuses the image when it exists.
#   usage: scripts/base-image.sh [TAG]        (default: envbuild-test/bookworm:base)
set -Eeuo pipefail
trap 'echo "base-image.sh: failed at line $LINENO" >&2' ERR

tag="${1:-envbuild-test/bookworm:base}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
# python3 + venv: the base's own distribution Python (3.11) is what the rendered recipe must use,
# as on a user's private mirror base. ca-certificates: pip needs a trust store.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "$tag"
