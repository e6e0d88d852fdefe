#!/usr/bin/env bash
# Make the local Debian bookworm base image the Docker tests build on (no registry is reachable
# from CI): debootstrap a minimal root, then 'docker import' it. Reuses the image when it exists.
#   usage: scripts/base-image.sh [--platform linux/amd64|linux/arm64] [TAG]
#   default TAG: envbuild-test/bookworm:base (amd64), envbuild-test/bookworm:base-arm64 (arm64)
# linux/arm64 on an x86_64 host needs qemu's binfmt handler (qemu-user-static, binfmt-support):
# debootstrap runs its second stage (the arm64 maintainer scripts) in the chroot through it.
set -Eeuo pipefail
trap 'echo "base-image.sh: failed at line $LINENO" >&2' ERR

platform="linux/amd64"
if [ "${1:-}" = "--platform" ]; then
  platform="${2:-}"
  shift 2 || { echo "base-image.sh: --platform needs linux/amd64 or linux/arm64" >&2; exit 2; }
fi
case "$platform" in
  linux/amd64) arch=amd64; machine=x86_64; default_tag="envbuild-test/bookworm:base" ;;
  linux/arm64) arch=arm64; machine=aarch64; default_tag="envbuild-test/bookworm:base-arm64" ;;
  *) echo "base-image.sh: unknown platform '$platform' — use linux/amd64 or linux/arm64" >&2; exit 2 ;;
esac
tag="${1:-$default_tag}"
if found="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$tag" 2>/dev/null)"; then
  if [ "$found" != "$platform" ]; then
    echo "base-image.sh: $tag is $found, not $platform — remove it or give another TAG" >&2
    exit 1
  fi
  echo "$tag"
  exit 0
fi
if [ "$(uname -m)" != "$machine" ] && [ ! -e "/proc/sys/fs/binfmt_misc/qemu-$machine" ]; then
  echo "base-image.sh: no binfmt handler for $machine (/proc/sys/fs/binfmt_misc/qemu-$machine) —" \
       "apt-get install qemu-user-static binfmt-support (DEVELOPERS.md)" >&2
  exit 1
fi
root="$(mktemp -d)"
trap 'rm -rf "$root" "$root.log" "$root.archive"' EXIT
# python3 + venv: the base's own distribution Python (3.11) is what the rendered recipe must use,
# as on a user's private mirror base. ca-certificates: pip needs a trust store.
debootstrap --arch="$arch" --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
if [ "$arch" = amd64 ]; then
  tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
else
  # The image's config must say its platform: build --platform takes it as the FROM, verify runs it
  # as that and the engine emulates it. 'docker import --platform linux/arm64' is not enough: a
  # 20.10 engine (Debian bookworm's docker.io) records its own architecture, amd64. So the root
  # goes in as a one-layer docker-archive (what 'docker save' writes) whose config says arm64.
  archive="$root.archive"
  mkdir -p "$archive/layer"
  tar -C "$root" -cf "$archive/layer/layer.tar" .
  diff_id="sha256:$(sha256sum "$archive/layer/layer.tar" | cut -d' ' -f1)"
  created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  cat >"$archive/config.json" <<JSON
{"architecture": "$arch", "os": "linux", "created": "$created", "config": {"Cmd": ["/bin/bash"]},
 "rootfs": {"type": "layers", "diff_ids": ["$diff_id"]},
 "history": [{"created": "$created", "created_by": "debootstrap --arch=$arch --variant=minbase bookworm"}]}
JSON
  printf '[{"Config": "config.json", "RepoTags": ["%s"], "Layers": ["layer/layer.tar"]}]\n' "$tag" \
    >"$archive/manifest.json"
  rm -rf "$root"
  tar -C "$archive" -c manifest.json config.json layer | docker load >/dev/null
fi
found="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$tag")"
if [ "$found" != "$platform" ]; then
  echo "base-image.sh: the image $tag is $found, not $platform" >&2
  exit 1
fi
echo "$tag"
