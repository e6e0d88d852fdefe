#!/usr/bin/env bash
# Rendered by envbuild from envbuild.lock (torch 2.15.0, cu132, Python 3.12, Ubuntu 24.04).
# Sets up an Ubuntu 20.04/22.04/24.04 x86_64 GPU host for this stack, as root:
#   preflight (nothing changes before it passes) -> NVIDIA's keyring -> kernel headers, driver (held,
#   kept out of unattended-upgrades), nvidia-persistenced -> nouveau blacklisted when loaded ->
#   NVSwitch: fabric manager of the driver's exact version -> optional CUDA toolkit -> NVIDIA
#   Container Toolkit, runtime configured, CDI spec -> the lock's --env pairs in /etc/profile.d -> Python and a venv with the pinned torch ->
#   the smoke test (then a GPU container when Docker is here, and dcgmi diag when DCGM is).
# A forward-compatibility stack keeps the driver branch it was resolved for, adds NVIDIA's cuda-compat
#   package and puts its directory first on LD_LIBRARY_PATH (venv activate, /etc/profile.d, smoke test).
# Idempotent: every step first checks whether it is already done, so a second run changes nothing.
# Driver branch: the newest production or long-term support branch that runs the stack.
#
# usage: sudo bash install.sh [options]   (--help lists them)
# exit: 0 done, 2 usage, 7/8 smoke test failed, 9 preflight failed (nothing changed), 10 reboot required
set -Eeuo pipefail

# --- the stack, from envbuild.lock (everything below this block is the same for every lock of this shape) ---
readonly VARIANT=cu132
readonly PYTHON_VERSION=3.12
readonly STACK_UBUNTU=24.04
readonly PYTHON_PROVISION=distro
readonly CUDA_VERSION=13.2
readonly MIN_DRIVER=595.45.04
readonly MIN_BRANCH=595
readonly DRIVER_BRANCH=620
readonly DRIVER_MODULES=open
readonly TOOLKIT_PACKAGE=cuda-toolkit-13-2
readonly COMPAT_PACKAGE=''
readonly COMPAT_DIR=''
readonly NVSWITCH_FORCED=0
readonly DEFAULT_RUNTIME=docker
readonly CTK_VERSION=1.20.0-1
readonly CTK_REPO=https://nvidia.github.io/libnvidia-container/stable/deb
readonly CTK_KEY_URL=https://nvidia.github.io/libnvidia-container/gpgkey
readonly CTK_KEY_FINGERPRINT=C95B321B61E88C1809C4F759DDCAE044F796ECB0
readonly SMOKE_IMAGE_PINNED=ubuntu:24.04@sha256:69cecf4bbf72d2d44a9eef1b71fb98c7fb973d78af11399deccef19beb008ad9
readonly INDEX_URL=https://download.pytorch.org/whl/cu132
readonly -a TORCH_PINS=(torch==2.15.0+cu132 torchvision==0.29.2+cu132)
readonly -a APT_EXTRA=()
readonly -a PIP_EXTRA=()
readonly -a ENV_PAIRS=()
readonly -a COMPILE_PACKAGES=(g++ python3-dev)
# --- end of the stack ---

readonly PREFIX=/opt/envbuild
readonly VENV=/opt/envbuild/venv
readonly REBOOT_FLAG=/var/run/reboot-required
# NVIDIA's network repository keyring package (replaces apt-key); its file name is the same for every
# supported Ubuntu (https://docs.nvidia.com/cuda/cuda-installation-guide-linux/, Network Repo Installation).
readonly KEYRING_DEB=cuda-keyring_1.1-1_all.deb
# The key NVIDIA signs its Debian/Ubuntu CUDA repositories with ("cudatools <cudatools@nvidia.com>", RSA,
# 2022-04-14), as NVIDIA publishes it: https://github.com/NVIDIA/cuda-repo-management/blob/main/SIGNATURES.md
# ("Primary key fingerprint: EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC", read 2026-11-24). The
# keyring package is installed as root, so every key it would make apt trust must be this one.
readonly NVIDIA_KEY_FINGERPRINT=EB693B3035CD5710E231E123A4B469963BF863CC
# NVIDIA Container Toolkit: apt source and keyring as NVIDIA's install guide names them
# (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html).
readonly CTK_KEYRING=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
readonly CTK_LIST=/etc/apt/sources.list.d/nvidia-container-toolkit.list
readonly CTK_PACKAGES=(nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1)
readonly CDI_SPEC=/etc/cdi/nvidia.yaml
# The fabric manager's package name. Up to R575 NVIDIA's repository ships nvidia-fabricmanager-<branch>.
# From R580 it ships one nvidia-fabricmanager, versioned by the driver, and nvidia-fabricmanager-<branch>
# is only a virtual package that it provides: apt cannot install a version of a virtual package
# (https://github.com/NVIDIA/gpu-driver-container/pull/451: "Package nvidia-fabricmanager-580 is a virtual
# package provided by: nvidia-fabricmanager 580.65.06-1 / E: Version '580.65.06-1' for
# 'nvidia-fabricmanager-580' was not found"; its scripts install nvidia-fabricmanager from 580 on).
# Ubuntu's own archive still builds a real nvidia-fabricmanager-<branch> for 580 and later
# (https://packages.ubuntu.com/questing/nvidia-fabricmanager-580, read 2026-11-25: jammy to resolute), so
# from R580 both names are tried, NVIDIA's first, each only at the loaded driver's exact version.
readonly FABRICMANAGER_UNVERSIONED_FROM=580
# How long the NVSwitch fabric may take to reach "Completed" once the fabric manager runs.
readonly FABRIC_WAIT=${ENVBUILD_FABRIC_WAIT:-120}
readonly DPKG_LOCKS=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock)
# Keeps nouveau from taking the GPU at boot; the two lines and the initramfs rebuild are NVIDIA's own
# steps for Ubuntu (https://docs.nvidia.com/cuda/cuda-installation-guide-linux/, Disabling Nouveau).
readonly NOUVEAU_CONF=/etc/modprobe.d/envbuild-blacklist-nouveau.conf
# apt reads every file in apt.conf.d whose name has no extension (or .conf) and only [A-Za-z0-9_.-]
# (apt.conf(5): https://manpages.ubuntu.com/manpages/lucid/en/man5/apt.conf.5.html); list entries in a
# later file are added to the list unattended-upgrades' own 50unattended-upgrades starts.
readonly UU_CONF=/etc/apt/apt.conf.d/51envbuild-nvidia-driver
# The lock's --env pairs, exported for login shells (sh and bash read /etc/profile.d/*.sh) and for the
# smoke test; removed again when a later lock sets none.
readonly ENV_FILE=/etc/profile.d/envbuild-env.sh
# Download attempts of this script's own loop, around curl's --retry (see download()).
readonly DOWNLOAD_TRIES=3
# Where the kernel shows UEFI variables; read for Secure Boot when mokutil is not installed.
readonly EFIVARS=${ENVBUILD_EFIVARS:-/sys/firmware/efi/efivars}
# EFI_GLOBAL_VARIABLE: the vendor GUID of the SecureBoot variable (UEFI specification, Globally
# Defined Variables); its value is 4 attribute bytes, then one byte, 1 when Secure Boot is on.
readonly SECURE_BOOT_VAR=SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c

log() { printf 'envbuild-install: %s\n' "$*"; }
warn() { printf 'envbuild-install: warning: %s\n' "$*" >&2; }
die() {
  local code=$1
  shift
  printf 'envbuild-install: error: %s\n' "$*" >&2
  exit "$code"
}
on_error() {
  printf 'envbuild-install: error: line %s failed (exit %s): %s\n' "$2" "$1" "$3" >&2
  printf 'envbuild-install: every step checks its own state first: fix the cause and run the script again\n' >&2
  exit "$1"
}
trap 'on_error "$?" "$LINENO" "$BASH_COMMAND"' ERR
trap 'printf "envbuild-install: interrupted; run the script again to finish\n" >&2; exit 130' INT TERM
# Temporary files and directories of this run: removed however it ends, so that no half-written
# download or configuration file outlives an error or an interrupt.
TEMP_PATHS=()
cleanup() {
  ((${#TEMP_PATHS[@]} == 0)) || rm -rf -- "${TEMP_PATHS[@]}"
}
trap cleanup EXIT

usage() {
  printf '%s\n' \
    "usage: sudo bash install.sh [options]" \
    "  --dry-run            print the plan after the preflight checks; change nothing" \
    "  --yes, -y            apply the plan without asking (needed without a terminal)" \
    "  --skip-driver        leave the NVIDIA driver as it is, even when too old" \
    "  --replace-driver     replace an installed driver that is too old" \
    "  --driver-branch N    install this driver branch instead of $DRIVER_BRANCH (not older than $MIN_BRANCH)" \
    "  --with-toolkit       also install the CUDA toolkit ($TOOLKIT_PACKAGE)" \
    "  --nvswitch           an NVSwitch system: install the fabric manager whatever detection finds" \
    "  --container-runtime R  docker|containerd|podman|none (default $DEFAULT_RUNTIME): the NVIDIA" \
    "                       Container Toolkit $CTK_VERSION, configured for R (none: not installed)" \
    "  --smoke-image REF    image of the GPU container check when Docker is here, by digest" \
    "                       (name[:tag]@sha256:<64 hex>; default: $SMOKE_IMAGE_PINNED)" \
    "  --dcgm-level N       dcgmi diag -r N when dcgmi is installed (default 1; 0 skips it)" \
    "  --no-smoke           skip the smoke test" \
    "  --lock-timeout S     wait up to S seconds for the dpkg lock (default 120)" \
    "  --deadline S         give up once the install has run S seconds (default 3600): checked" \
    "                       before each step, and no download may run past it" \
    "  --download-timeout S cut any one download (retries included) after S seconds (default 600);" \
    "                       downloads are https only, redirects included" \
    "exit: 0 done, 2 usage, 7/8 smoke test failed, 9 preflight failed, 10 reboot required"
}

# --- options ---------------------------------------------------------------------------------------
DRY_RUN=0
ASSUME_YES=0
SKIP_DRIVER=0
REPLACE_DRIVER=0
WITH_TOOLKIT=0
RUN_SMOKE=1
LOCK_TIMEOUT=120
DEADLINE=3600
DOWNLOAD_TIMEOUT=600
BRANCH_WANTED=$DRIVER_BRANCH
NVSWITCH=$NVSWITCH_FORCED
RUNTIME=$DEFAULT_RUNTIME
SMOKE_IMAGE=$SMOKE_IMAGE_PINNED
DCGM_LEVEL=1

parse_args() {
  while (($# > 0)); do
    case $1 in
      --dry-run) DRY_RUN=1 ;;
      --yes | -y) ASSUME_YES=1 ;;
      --skip-driver) SKIP_DRIVER=1 ;;
      --replace-driver) REPLACE_DRIVER=1 ;;
      --with-toolkit) WITH_TOOLKIT=1 ;;
      --no-smoke) RUN_SMOKE=0 ;;
      --nvswitch) NVSWITCH=1 ;;
      --container-runtime | --smoke-image | --dcgm-level)
        (($# > 1)) || die 2 "$1 needs a value"
        case $1 in
          --container-runtime) RUNTIME=$2 ;;
          --smoke-image) SMOKE_IMAGE=$2 ;;
          *) DCGM_LEVEL=$2 ;;
        esac
        shift
        ;;
      --driver-branch)
        (($# > 1)) || die 2 "--driver-branch needs a number"
        BRANCH_WANTED=$2
        shift
        ;;
      --lock-timeout)
        (($# > 1)) || die 2 "--lock-timeout needs a number of seconds"
        LOCK_TIMEOUT=$2
        shift
        ;;
      --deadline)
        (($# > 1)) || die 2 "--deadline needs a number of seconds"
        DEADLINE=$2
        shift
        ;;
      --download-timeout)
        (($# > 1)) || die 2 "--download-timeout needs a number of seconds"
        DOWNLOAD_TIMEOUT=$2
        shift
        ;;
      -h | --help)
        usage
        exit 0
        ;;
      *) die 2 "unknown option '$1' (see --help)" ;;
    esac
    shift
  done
  [[ $LOCK_TIMEOUT =~ ^[0-9]{1,5}$ ]] || die 2 "--lock-timeout must be a number of seconds"
  [[ $DEADLINE =~ ^[1-9][0-9]{0,5}$ ]] || die 2 "--deadline must be a number of seconds"
  [[ $DOWNLOAD_TIMEOUT =~ ^[1-9][0-9]{0,5}$ ]] || die 2 "--download-timeout must be a number of seconds"
  if [[ -n $DRIVER_BRANCH ]]; then
    [[ $BRANCH_WANTED =~ ^[0-9]{3}$ ]] || die 2 "--driver-branch must be a driver branch such as $DRIVER_BRANCH"
    ((BRANCH_WANTED >= MIN_BRANCH)) \
      || die 2 "--driver-branch $BRANCH_WANTED is older than $MIN_BRANCH, the oldest that runs CUDA $CUDA_VERSION"
    [[ -z $COMPAT_PACKAGE || $BRANCH_WANTED == "$DRIVER_BRANCH" ]] \
      || die 2 "--driver-branch $BRANCH_WANTED: this stack runs CUDA $CUDA_VERSION through forward compatibility ($COMPAT_PACKAGE) resolved for branch $DRIVER_BRANCH; render the script for --driver $BRANCH_WANTED"
  fi
  # Ubuntu's metapackage of the open kernel modules is nvidia-driver-<branch>-open.
  DRIVER_PACKAGE=nvidia-driver-$BRANCH_WANTED
  [[ $DRIVER_MODULES != open ]] || DRIVER_PACKAGE+=-open
  case $RUNTIME in docker | containerd | podman | none) ;; *) die 2 "--container-runtime must be docker, containerd, podman or none" ;; esac
  [[ $RUNTIME == none || -n $CTK_VERSION ]] || die 2 "--container-runtime $RUNTIME: this script was rendered without the container toolkit (render it with --container-runtime $RUNTIME)"
  [[ $DCGM_LEVEL =~ ^[0-4]$ ]] || die 2 "--dcgm-level must be 0 (skip) or a dcgmi diag level 1 to 4"
  # By digest only: a tag moves, and the check would run whatever it names that day as root with the GPUs.
  [[ -z $SMOKE_IMAGE || $SMOKE_IMAGE =~ ^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_.-]+)?@sha256:[0-9a-f]{64}$ ]] \
    || die 2 "--smoke-image must be an image reference by digest such as ubuntu:24.04@sha256:<64 hex>"
  if ((WITH_TOOLKIT)) && [[ -z $TOOLKIT_PACKAGE ]]; then
    die 2 "--with-toolkit: this stack has no CUDA (variant $VARIANT)"
  fi
}

# --- probes (read-only) ----------------------------------------------------------------------------
installed() { # package name -> status 0 when dpkg lists it as installed
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true) == installed ]]
}

driver_version() { # the loaded driver's version, or nothing
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '[:space:]' || true
}

driver_packages() { # installed nvidia-driver-<branch> metapackages
  dpkg-query -W -f='${db:Status-Status} ${Package}\n' 'nvidia-driver-[0-9]*' 2>/dev/null \
    | awk '$1 == "installed" { print $2 }' || true
}

pkg_version() { # the installed version of package $1, or nothing
  dpkg-query -W -f='${db:Status-Status} ${Version}' "$1" 2>/dev/null | awk '$1 == "installed" { print $2 }' || true
}

gpu_names() { # one line per GPU, as the loaded driver names it
  [[ -n $DRIVER_NOW ]] || return 0
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true
}

nvswitch_found() {
  ((NVSWITCH)) && return 0
  # NVSwitches on the PCI bus are NVIDIA bridges, class 0680 (A100's 10de:1af1, H100's 10de:22a3);
  # else eight GPUs of an HGX board's SXM parts, as the loaded driver names them.
  grep -q ' 0680: ' <<<"$(lspci -n -d 10de: 2>/dev/null || true)" && return 0
  (($(gpu_names | grep -Ec 'SXM|HBM3|^NVIDIA H200$|^NVIDIA B[23]00$' || true) >= 8))
}

fabric_state() { # the "State" line of nvidia-smi -q's Fabric section (Completed, In Progress, N/A)
  nvidia-smi -q 2>/dev/null | awk '/^ *Fabric *$/ { f = 1; next } f && /^ *State *:/ { sub(/^[^:]*: */, ""); print; exit }' || true
}

fabricmanager_names() { # the fabric manager's package names for the loaded driver's branch, NVIDIA's first
  local branch=${DRIVER_NOW%%.*}
  if ((branch >= FABRICMANAGER_UNVERSIONED_FROM)); then
    printf '%s\n' nvidia-fabricmanager "nvidia-fabricmanager-$branch"
  else
    printf '%s\n' "nvidia-fabricmanager-$branch"
  fi
}

fabricmanager_installed() { # the name of the installed fabric manager of exactly the loaded driver's version
  local name
  for name in $(fabricmanager_names); do
    if [[ $(pkg_version "$name") == "$DRIVER_NOW"-* ]]; then
      echo "$name"
      return 0
    fi
  done
  return 1
}

fabric_ready() { # the fabric manager of exactly the loaded driver's version runs
  fabricmanager_installed >/dev/null && systemctl is-active --quiet nvidia-fabricmanager 2>/dev/null
}

runtime_unconfigured() { # the chosen runtime is installed and has no nvidia runtime yet
  case $RUNTIME in
    docker) command -v docker >/dev/null 2>&1 && ! grep -qs nvidia-container-runtime /etc/docker/daemon.json ;;
    containerd) command -v containerd >/dev/null 2>&1 && ! grep -rqs nvidia-container-runtime /etc/containerd ;;
    *) return 1 ;; # podman reads the CDI spec; nothing to configure
  esac
}

ctk_list_text() {
  # shellcheck disable=SC2016 # $(ARCH) is apt's, not the shell's
  printf 'deb [signed-by=%s] %s/$(ARCH) /\n' "$CTK_KEYRING" "$CTK_REPO"
}

has_nvidia_gpu() {
  if command -v lspci >/dev/null 2>&1; then
    # 10de: NVIDIA's PCI vendor id; classes 0300 (VGA) and 0302 (3D controller) are GPUs.
    # Read whole first: grep -q stops at its first match, and under pipefail an lspci still
    # writing would then die of SIGPIPE and fail the pipe (a GPU found read as none).
    grep -Eq ' 030[02]: ' <<<"$(lspci -n -d 10de: 2>/dev/null || true)" && return 0
    return 1
  fi
  local dev
  for dev in /sys/bus/pci/devices/*; do
    [[ -r $dev/vendor && $(<"$dev/vendor") == 0x10de && $(<"$dev/class") == 0x030[02]* ]] && return 0
  done
  return 1
}

secure_boot_enabled() {
  if command -v mokutil >/dev/null 2>&1; then
    mokutil --sb-state 2>/dev/null | grep -q 'SecureBoot enabled'
    return
  fi
  # No mokutil (minimal images): the UEFI variable itself. No such variable: legacy BIOS boot,
  # or Secure Boot unsupported, so unsigned modules load.
  [[ -r $EFIVARS/$SECURE_BOOT_VAR ]] || return 1
  [[ $(od -An -t u1 -j 4 -N 1 "$EFIVARS/$SECURE_BOOT_VAR" 2>/dev/null | tr -d ' \n') == 1 ]]
}

nouveau_loaded() { # lsmod reads /proc/modules; without kmod, read it directly
  local modules
  if command -v lsmod >/dev/null 2>&1; then
    modules=$(lsmod 2>/dev/null || true)
  else
    modules=$(cat /proc/modules 2>/dev/null || true)
  fi
  printf '%s\n' "$modules" | awk '$1 == "nouveau" { found = 1 } END { exit !found }'
}

nouveau_conf_text() {
  printf '%s\n' \
    "# Written by envbuild's install.sh: the NVIDIA driver needs the GPU that nouveau would take." \
    "blacklist nouveau" \
    "options nouveau modeset=0"
}

unattended_upgrades_present() {
  installed unattended-upgrades || [[ -e /etc/apt/apt.conf.d/50unattended-upgrades ]]
}

env_file_text() { # the --env pairs as POSIX sh: each value in single quotes, a quote in it as '\''
  local pair value
  printf '%s\n' "# Written by envbuild's install.sh from the lock's --env pairs."
  for pair in "${ENV_PAIRS[@]}"; do
    value=$(printf '%s' "${pair#*=}" | sed "s/'/'\\\\''/g")
    printf "export %s='%s'\n" "${pair%%=*}" "$value"
  done
  [[ -z $COMPAT_DIR ]] || printf '%s\n%s\n' "# Forward compatibility: $COMPAT_PACKAGE's libcuda first." "$(compat_path_line)"
}

compat_path_line() { # sh: $COMPAT_DIR first on LD_LIBRARY_PATH, once (for activate and profile.d)
  # shellcheck disable=SC2016 # expanded by the shell that reads the line, not by this one
  printf 'case ":${LD_LIBRARY_PATH:-}:" in *":%s:"*) ;; *) export LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac\n' \
    "$COMPAT_DIR" "$COMPAT_DIR"
}

activate_has_compat() { # the venv's activate script already puts $COMPAT_DIR first
  grep -qxF "$(compat_path_line)" "$VENV/bin/activate" 2>/dev/null
}

uu_blacklist_text() { # the apt configuration keeping unattended-upgrades off the held NVIDIA packages
  local held=() name
  mapfile -t held < <(apt-mark showhold 2>/dev/null | grep nvidia | sort -u || true)
  ((${#held[@]} > 0)) || return 0
  printf '%s\n' \
    "// Written by envbuild's install.sh: unattended-upgrades leaves the NVIDIA driver packages it" \
    "// installed (and holds) alone. Entries are Python regular expressions" \
    "// (https://github.com/mvo5/unattended-upgrades, README: Unattended-Upgrade::Package-Blacklist);" \
    "// '.' and '+' are bracketed because apt.conf leaves a backslash in a value undefined." \
    "Unattended-Upgrade::Package-Blacklist {"
  for name in "${held[@]}"; do
    name=${name//./[.]}
    printf '  "^%s$";\n' "${name//+/[+]}"
  done
  printf '};\n'
}

differs() { # $1 file, $2 text: status 0 when the file is missing or holds other bytes
  ! cmp -s "$1" <(printf '%s' "$2")
}

dpkg_lock_holders() { # PIDs that hold one of dpkg's or apt's lock files open
  local fd target pid
  for fd in /proc/[0-9]*/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    case " ${DPKG_LOCKS[*]} " in
      *" $target "*)
        pid=${fd#/proc/}
        pid=${pid%%/*}
        [[ $pid != "$$" && $pid != "$BASHPID" ]] && printf '%s\n' "$pid"
        ;;
    esac
  done | sort -un
}

venv_ready() {
  [[ -x $VENV/bin/python ]] \
    && [[ $("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == "$PYTHON_VERSION" ]]
}

pins_satisfied() { # every torch pin and extra package installed at its exact version
  venv_ready || return 1
  "$VENV/bin/python" -c '
import sys
from importlib import metadata
for spec in sys.argv[1:]:
    name, _, version = spec.partition("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
    if version and found != version:
        sys.exit(1)
' "${TORCH_PINS[@]}" "${PIP_EXTRA[@]}" 2>/dev/null
}

copy_needed() { # $1 source, $2 target: status 0 when the target is missing or differs
  [[ $1 -ef $2 ]] && return 1
  ! cmp -s "$1" "$2"
}

# --- preflight: every check before any change; failures exit 9 ----------------------------------------
preflight() {
  ((EUID == 0)) || die 9 "must run as root (try: sudo bash $0)"
  [[ -r /etc/os-release ]] || die 9 "cannot read /etc/os-release; Ubuntu 20.04, 22.04 or 24.04 required"
  local id version
  # shellcheck source=/dev/null
  id=$(. /etc/os-release && printf '%s' "${ID:-}")
  # shellcheck source=/dev/null
  version=$(. /etc/os-release && printf '%s' "${VERSION_ID:-}")
  case "$id $version" in
    "ubuntu 20.04") NVIDIA_DISTRO=ubuntu2004 ;;
    "ubuntu 22.04") NVIDIA_DISTRO=ubuntu2204 ;;
    "ubuntu 24.04") NVIDIA_DISTRO=ubuntu2404 ;;
    *) die 9 "unsupported OS '$id $version': this script supports Ubuntu 20.04, 22.04 and 24.04" ;;
  esac
  NVIDIA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/$NVIDIA_DISTRO/x86_64
  local arch
  arch=$(uname -m)
  [[ $arch == x86_64 ]] || die 9 "unsupported architecture $arch: NVIDIA's repository path used here is x86_64"
  if [[ $PYTHON_PROVISION == distro && $version != "$STACK_UBUNTU" ]]; then
    die 9 "the stack uses Ubuntu $STACK_UBUNTU's python3 ($PYTHON_VERSION), this host runs Ubuntu $version" \
      "- render the script for --ubuntu $version"
  fi
  if [[ $PYTHON_PROVISION == distro ]] && command -v python3 >/dev/null 2>&1; then
    local have
    have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [[ $have == "$PYTHON_VERSION" ]] || die 9 "python3 is $have, the stack needs $PYTHON_VERSION"
  fi
  if [[ $RUN_SMOKE == 1 ]]; then
    [[ -r $SOURCE_DIR/smoke.py || -r $PREFIX/smoke.py ]] \
      || die 9 "smoke.py not found beside $0 (render writes it there); pass --no-smoke to skip the test"
    [[ -r $SOURCE_DIR/envbuild.lock || -r $PREFIX/envbuild.lock ]] \
      || die 9 "envbuild.lock not found beside $0; pass --no-smoke to skip the test"
  fi
  preflight_driver
  wait_for_dpkg
}

preflight_driver() {
  DRIVER_NOW=$(driver_version)
  INSTALL_DRIVER=0
  NOUVEAU_LOADED=0
  OLD_DRIVERS=()
  [[ -n $MIN_DRIVER ]] || return 0 # a CPU stack needs no GPU and no driver
  has_nvidia_gpu || die 9 "no NVIDIA GPU found (lspci -d 10de:); this stack needs one"
  # nouveau matters only while no NVIDIA driver answers: then it holds the GPU the driver needs.
  if [[ -z $DRIVER_NOW ]] && nouveau_loaded; then
    if ((SKIP_DRIVER)); then
      warn "nouveau is loaded; --skip-driver leaves it (the NVIDIA driver cannot load beside it)"
    else
      command -v update-initramfs >/dev/null 2>&1 \
        || die 9 "nouveau is loaded and update-initramfs is missing: install initramfs-tools, then run again"
      NOUVEAU_LOADED=1
    fi
  fi
  if [[ -z $DRIVER_NOW ]] && command -v nvidia-smi >/dev/null 2>&1 && [[ -n $(driver_packages) ]]; then
    # With nouveau loaded the driver cannot load: plan() blacklists nouveau, the run ends in a reboot.
    ((!NOUVEAU_LOADED)) || return 0
    if [[ -e $REBOOT_FLAG ]]; then
      log "REBOOT REQUIRED: a driver is installed but not loaded; reboot, then run this script again"
      exit 10
    fi
    die 9 "nvidia-smi fails although a driver package is installed; check 'nvidia-smi' and dmesg"
  fi
  [[ -z $COMPAT_PACKAGE ]] || preflight_forward
  if [[ -n $DRIVER_NOW ]] && dpkg --compare-versions "$DRIVER_NOW" ge "$MIN_DRIVER"; then
    return 0
  fi
  if ((SKIP_DRIVER)); then
    warn "driver ${DRIVER_NOW:-none} is older than $MIN_DRIVER (CUDA $CUDA_VERSION); --skip-driver leaves it"
    return 0
  fi
  mapfile -t OLD_DRIVERS < <(driver_packages)
  if [[ -n $DRIVER_NOW || ${#OLD_DRIVERS[@]} -gt 0 ]] && ((!REPLACE_DRIVER)); then
    die 9 "driver ${DRIVER_NOW:-${OLD_DRIVERS[*]}} is older than $MIN_DRIVER, the oldest that runs CUDA $CUDA_VERSION" \
      "- pass --replace-driver to install $DRIVER_PACKAGE in its place, or --skip-driver"
  fi
  if secure_boot_enabled; then
    die 9 "Secure Boot is enabled and $DRIVER_PACKAGE builds an unsigned module (DKMS)" \
      "- install Ubuntu's signed linux-modules-${DRIVER_PACKAGE#nvidia-driver-}-<kernel flavour> packages or enroll" \
      "a MOK key (mokutil --import), then run with --skip-driver"
  fi
  INSTALL_DRIVER=1
}

# Forward compatibility runs on NVIDIA's datacenter GPUs (and select NGC Server Ready RTX SKUs and
# Jetson); other GeForce/RTX GPUs fail with CUDA error 804. Each cuda-compat package supports a
# listed set of older driver branches and none newer, so the loaded driver must be the branch the
# stack was resolved for, even with --skip-driver
# (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html, read 2026-11-24).
preflight_forward() {
  local name
  if [[ -n $DRIVER_NOW && ${DRIVER_NOW%%.*} != "$DRIVER_BRANCH" ]]; then
    die 9 "driver $DRIVER_NOW is branch ${DRIVER_NOW%%.*}; this stack runs CUDA $CUDA_VERSION through forward" \
      "compatibility ($COMPAT_PACKAGE) resolved for branch $DRIVER_BRANCH - render the script for --driver $DRIVER_NOW"
  fi
  name=$(gpu_names | grep -m 1 GeForce || true)
  [[ -z $name ]] || die 9 "$name is not a datacenter GPU: forward compatibility ($COMPAT_PACKAGE) runs on datacenter GPUs only (CUDA error 804) - render the script for this GPU"
}

wait_for_dpkg() {
  local waited=0 holders
  holders=$(dpkg_lock_holders)
  while [[ -n $holders ]]; do
    if ((waited >= LOCK_TIMEOUT)); then
      local pid names=()
      for pid in $holders; do
        names+=("$pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true))")
      done
      die 9 "dpkg lock held for ${LOCK_TIMEOUT}s by PID ${names[*]}; wait for it or stop it, then run again"
    fi
    ((waited == 0)) && log "waiting up to ${LOCK_TIMEOUT}s for the dpkg lock (PID ${holders//$'\n'/ })"
    sleep 1
    waited=$((waited + 1))
    holders=$(dpkg_lock_holders)
  done
}

# --- the plan: what this run would change, decided before anything changes ---------------------------
plan() {
  PLAN=()
  NEED_NVIDIA_REPO=0
  APT_NEEDED=()
  WRITE_NOUVEAU=0
  WRITE_UU=0
  if ((INSTALL_DRIVER)); then
    NEED_NVIDIA_REPO=1
    ((${#OLD_DRIVERS[@]} == 0)) || PLAN+=("unhold and purge ${OLD_DRIVERS[*]}")
    PLAN+=("install $DRIVER_PACKAGE and linux-headers-$(uname -r) (driver now: ${DRIVER_NOW:-none}, needed: >= $MIN_DRIVER) and hold the driver")
  elif [[ -n $COMPAT_PACKAGE && -n $DRIVER_NOW ]]; then
    log "driver $DRIVER_NOW runs CUDA $CUDA_VERSION through forward compatibility ($COMPAT_PACKAGE): unchanged"
  elif [[ -n $MIN_DRIVER && -n $DRIVER_NOW ]]; then
    log "driver $DRIVER_NOW runs CUDA $CUDA_VERSION (needs >= $MIN_DRIVER): unchanged"
  fi
  COMPAT=0
  if [[ -n $COMPAT_PACKAGE ]] && ! installed "$COMPAT_PACKAGE"; then
    COMPAT=1
    NEED_NVIDIA_REPO=1
    PLAN+=("install $COMPAT_PACKAGE (forward compatibility: CUDA $CUDA_VERSION on driver branch $DRIVER_BRANCH; its libcuda in $COMPAT_DIR)")
  fi
  ENABLE_PERSISTENCED=0
  if [[ -n $MIN_DRIVER ]] && { ((INSTALL_DRIVER)) || [[ -n $DRIVER_NOW ]]; }; then
    if command -v systemctl >/dev/null 2>&1 && ! systemctl is-enabled --quiet nvidia-persistenced 2>/dev/null; then
      ENABLE_PERSISTENCED=1
      PLAN+=("enable nvidia-persistenced")
    fi
  fi
  FABRIC=0
  if [[ -n $MIN_DRIVER ]] && nvswitch_found; then
    if [[ -z $DRIVER_NOW ]] || ((INSTALL_DRIVER)); then
      PLAN+=("NVSwitch system: the fabric manager follows once the new driver is loaded (the run after the reboot)")
    elif ! fabric_ready; then
      FABRIC=1
      NEED_NVIDIA_REPO=1
      PLAN+=("install the fabric manager $DRIVER_NOW (the loaded driver's version; $(fabricmanager_names | paste -sd'|' -)) and start it")
    fi
  fi
  if unattended_upgrades_present; then
    local blacklist
    blacklist=$(uu_blacklist_text)
    if ((INSTALL_DRIVER)) || { [[ -n $blacklist ]] && differs "$UU_CONF" "$blacklist"$'\n'; }; then
      WRITE_UU=1
      PLAN+=("keep unattended-upgrades away from the held NVIDIA packages ($UU_CONF)")
    fi
  fi
  WRITE_ENV=0
  if [[ ${#ENV_PAIRS[@]} -gt 0 || -n $COMPAT_DIR ]] && differs "$ENV_FILE" "$(env_file_text)"$'\n'; then
    WRITE_ENV=1
    if ((${#ENV_PAIRS[@]} > 0)); then
      PLAN+=("export the lock's --env pairs in $ENV_FILE")
    fi
    [[ -z $COMPAT_DIR ]] || PLAN+=("put $COMPAT_DIR first on LD_LIBRARY_PATH in $ENV_FILE")
  elif [[ ${#ENV_PAIRS[@]} -eq 0 && -z $COMPAT_DIR && -e $ENV_FILE ]]; then
    WRITE_ENV=1
    PLAN+=("remove $ENV_FILE (the lock sets no --env)")
  fi
  if ((NOUVEAU_LOADED)) && differs "$NOUVEAU_CONF" "$(nouveau_conf_text)"$'\n'; then
    WRITE_NOUVEAU=1
    PLAN+=("blacklist nouveau in $NOUVEAU_CONF and run update-initramfs -u (a reboot follows)")
  fi
  if ((WITH_TOOLKIT)) && ! installed "$TOOLKIT_PACKAGE"; then
    NEED_NVIDIA_REPO=1
    PLAN+=("install $TOOLKIT_PACKAGE")
  fi
  CTK=0
  CONFIGURE_RUNTIME=0
  CDI=0
  if [[ $RUNTIME != none ]]; then
    if [[ $(pkg_version nvidia-container-toolkit) != "$CTK_VERSION" || ! -s $CTK_KEYRING ]]; then
      CTK=1
      PLAN+=("install the NVIDIA Container Toolkit $CTK_VERSION from $CTK_REPO (key $CTK_KEY_FINGERPRINT)")
      command -v curl >/dev/null 2>&1 || APT_NEEDED+=(curl ca-certificates)
      command -v python3 >/dev/null 2>&1 || APT_NEEDED+=(python3) # reads the key's fingerprint
    fi
    if runtime_unconfigured; then
      CONFIGURE_RUNTIME=1
      PLAN+=("nvidia-ctk runtime configure --runtime=$RUNTIME, then restart $RUNTIME")
    fi
    if [[ -n $DRIVER_NOW && ! -s $CDI_SPEC ]]; then
      CDI=1
      PLAN+=("generate the CDI spec $CDI_SPEC (nvidia-ctk cdi generate)")
    fi
  fi
  if ((NEED_NVIDIA_REPO)) && ! installed cuda-keyring; then
    PLAN=("install NVIDIA's keyring $NVIDIA_REPO/$KEYRING_DEB" "${PLAN[@]}")
    command -v curl >/dev/null 2>&1 || APT_NEEDED+=(curl ca-certificates)
    command -v python3 >/dev/null 2>&1 || APT_NEEDED+=(python3) # reads the keyring's fingerprints
  fi
  local package
  if [[ $PYTHON_PROVISION == distro ]]; then
    for package in python3 python3-venv; do installed "$package" || APT_NEEDED+=("$package"); done
  elif ! venv_ready; then
    command -v curl >/dev/null 2>&1 || APT_NEEDED+=(curl ca-certificates)
  fi
  for package in "${APT_EXTRA[@]}" "${COMPILE_PACKAGES[@]}"; do installed "${package%%=*}" || APT_NEEDED+=("$package"); done
  ((${#APT_NEEDED[@]} == 0)) || PLAN=("apt-get install ${APT_NEEDED[*]}" "${PLAN[@]}")
  venv_ready || PLAN+=("create the venv $VENV (Python $PYTHON_VERSION, $PYTHON_PROVISION)")
  COMPAT_ACTIVATE=0
  if [[ -n $COMPAT_DIR ]] && ! { venv_ready && activate_has_compat; }; then
    COMPAT_ACTIVATE=1
    PLAN+=("put $COMPAT_DIR first on LD_LIBRARY_PATH in $VENV/bin/activate")
  fi
  pins_satisfied || PLAN+=("pip install ${TORCH_PINS[*]} ${PIP_EXTRA[*]} into $VENV")
  local name
  for name in envbuild.lock smoke.py; do
    if [[ -r $SOURCE_DIR/$name ]] && copy_needed "$SOURCE_DIR/$name" "$PREFIX/$name"; then
      PLAN+=("copy $name to $PREFIX/")
    fi
  done
}

# --- the changes -----------------------------------------------------------------------------------------
APT_UPDATED=0
apt_get() {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$LOCK_TIMEOUT" "$@"
}
apt_install() {
  if ((!APT_UPDATED)); then
    apt_get update
    APT_UPDATED=1
  fi
  apt_get install -y "$@"
}

write_atomic() { # $1 target, $2 text: written beside the target, then renamed over it
  local tmp dir
  dir=$(dirname "$1")
  mkdir -p "$dir"
  # The .tmp name is one neither apt (apt.conf.d) nor modprobe (*.conf only) reads.
  tmp=$(mktemp "$dir/.envbuild-XXXXXX.tmp")
  TEMP_PATHS+=("$tmp")
  printf '%s' "$2" >"$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$1"
}

# curl's --retry repeats only what curl deems transient: a timeout or an HTTP 408, 429, 500, 502, 503
# or 504 (https://everything.curl.dev/usingcurl/downloads/retry). A connection cut mid-body (exit 18,
# partial file; 56, receive failure: https://everything.curl.dev/cmdline/exitcode) is not; the
# --retry-all-errors that would cover it came in curl 7.71.0 (https://curl.se/ch/7.71.0.html), and
# Ubuntu 20.04's curl lacks it (https://gitlab.com/fdroid/fdroidserver/-/issues/1064). So this loop
# retries those network failures itself, into a temporary name renamed only once complete.
# Every download is https, redirects included (--proto/--proto-redir: a redirect to http:// fails
# instead of being followed), and ends within --download-timeout and the install's --deadline:
# timeout(1) bounds the whole curl run, its own retries included, so a server that trickles a byte
# a second cannot hold the install (or a cloud-init first boot) open.
DOWNLOAD_RC=0
download() { # $1 URL, $2 file: status 0 with the whole file in place, else no file and DOWNLOAD_RC set
  local url=$1 file=$2 part="$2.part" try started=$SECONDS budget
  TEMP_PATHS+=("$part")
  for ((try = 1; ; try++)); do
    budget=$((DOWNLOAD_TIMEOUT - (SECONDS - started)))
    ((budget <= DEADLINE_AT - SECONDS)) || budget=$((DEADLINE_AT - SECONDS))
    DOWNLOAD_RC=28 # out of time, as curl's own timeout reports it
    ((budget > 0)) || return 1
    DOWNLOAD_RC=0
    timeout "$budget" curl -fsSL --proto =https --proto-redir =https --retry 3 --connect-timeout 30 -o "$part" "$url" || DOWNLOAD_RC=$?
    ((DOWNLOAD_RC != 124)) || DOWNLOAD_RC=28 # timeout(1) ended it
    if ((DOWNLOAD_RC == 0)); then
      mv -f "$part" "$file"
      return 0
    fi
    rm -f "$part"
    case $DOWNLOAD_RC in
      6 | 7 | 18 | 28 | 52 | 55 | 56) ;; # resolve, connect, partial, timeout, empty reply, send, receive
      *) return 1 ;;
    esac
    ((try < DOWNLOAD_TRIES)) || return 1
    warn "download of $url failed (curl exit $DOWNLOAD_RC); retrying in $((try * 2))s"
    sleep $((try * 2))
  done
}

keyring_fingerprints() { # $1 a keyring .deb, $2 a scratch dir: the primary keys it holds, one a line
  dpkg-deb --fsys-tarfile "$1" >"$2/data.tar" 2>/dev/null || return 1
  openpgp_fingerprints tar "$2/data.tar"
}

# tar FILE: the primary keys of every key file in a tar; armor FILE OUT: those of an ASCII-armored
# key (RFC 4880, 6.2), written unarmored to OUT for apt's signed-by.
openpgp_fingerprints() {
  # OpenPGP v4 fingerprint: SHA-1 of 0x99, the two-byte length and the public-key packet body
  # (RFC 4880, 12.2); packets are walked by their headers (4.2). Anything unreadable fails.
  python3 - "$@" <<'PY'
import base64, hashlib, sys, tarfile

def packets(data):
    i = 0
    while i < len(data):
        head = data[i]
        if not head & 0x80:
            raise ValueError("not an OpenPGP packet")
        if head & 0x40:  # new format
            tag, first = head & 0x3F, data[i + 1]
            if first < 192:
                size, i = first, i + 2
            elif first < 224:
                size, i = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            elif first == 255:
                size, i = int.from_bytes(data[i + 2:i + 6], "big"), i + 6
            else:
                raise ValueError("partial length in a key")
        else:
            tag, kind = (head >> 2) & 0x0F, head & 3
            if kind == 3:
                raise ValueError("indeterminate length in a key")
            width = (1, 2, 4)[kind]
            size, i = int.from_bytes(data[i + 1:i + 1 + width], "big"), i + 1 + width
        body = data[i:i + size]
        if len(body) != size:
            raise ValueError("truncated packet")
        i += size
        yield tag, body

def fingerprints(data):
    for tag, body in packets(data):
        if tag == 6:  # a primary public key; subkeys (14) belong to it
            if body[0] != 4:
                raise ValueError("not a v4 key")
            print(hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper())

if sys.argv[1] == "armor":
    lines = open(sys.argv[2]).read().splitlines()
    start = lines.index("-----BEGIN PGP PUBLIC KEY BLOCK-----") + 1
    start = lines.index("", start) + 1  # after the armor headers
    body = [line for line in lines[start:] if line and not line.startswith(("=", "-----"))]
    data = base64.b64decode("".join(body), validate=True)
    fingerprints(data)
    open(sys.argv[3], "wb").write(data)
    sys.exit()
with tarfile.open(sys.argv[2]) as tar:
    for member in tar:
        # Every key file the package ships, wherever it goes (apt trusts .gpg and armored .asc
        # files; armor is not read here, so an .asc file fails the check).
        if member.isfile() and member.name.endswith((".gpg", ".asc")):
            if member.name.endswith(".asc"):
                raise ValueError("an armored key file")
            fingerprints(tar.extractfile(member).read())
PY
}

keyring_is_nvidias() { # $1 the downloaded keyring .deb, $2 a scratch dir
  local found
  found=$(keyring_fingerprints "$1" "$2") || return 1
  [[ -n $found && -z $(grep -vx "$NVIDIA_KEY_FINGERPRINT" <<<"$found" || true) ]]
}

install_keyring() {
  installed cuda-keyring && return 0
  local dir
  dir=$(mktemp -d)
  TEMP_PATHS+=("$dir")
  # Downloaded to a fresh directory and installed as a package: apt never sees a repository entry
  # without its key, and a failed download leaves no file behind.
  if ! download "$NVIDIA_REPO/$KEYRING_DEB" "$dir/$KEYRING_DEB"; then
    rm -rf "$dir"
    die 1 "cannot download $NVIDIA_REPO/$KEYRING_DEB (curl exit $DOWNLOAD_RC); check the network, then run again"
  fi
  if ! keyring_is_nvidias "$dir/$KEYRING_DEB" "$dir"; then
    rm -rf "$dir"
    die 1 "$NVIDIA_REPO/$KEYRING_DEB holds a key other than NVIDIA's repository key $NVIDIA_KEY_FINGERPRINT; not installed"
  fi
  apt_install "$dir/$KEYRING_DEB"
  rm -rf "$dir"
  APT_UPDATED=0 # the new repository's package lists are not fetched yet
}

blacklist_nouveau() {
  write_atomic "$NOUVEAU_CONF" "$(nouveau_conf_text)"$'\n'
  # The initramfs carries its own copy of modprobe.d; without the rebuild nouveau still loads early.
  if ! update-initramfs -u; then
    rm -f "$NOUVEAU_CONF" # so that the next run writes it and rebuilds again
    die 1 "update-initramfs -u failed; $NOUVEAU_CONF removed again: fix the cause and run again"
  fi
  touch "$REBOOT_FLAG"
}

keep_uu_away() {
  local blacklist
  blacklist=$(uu_blacklist_text)
  [[ -n $blacklist ]] || return 0
  differs "$UU_CONF" "$blacklist"$'\n' || return 0
  write_atomic "$UU_CONF" "$blacklist"$'\n'
}

install_driver() {
  local package
  for package in "${OLD_DRIVERS[@]}"; do
    log "replacing $package (--replace-driver)"
    apt-mark unhold "$package" >/dev/null
    apt_get purge -y "$package"
  done
  apt_install "$DRIVER_PACKAGE" "linux-headers-$(uname -r)" # DKMS builds the module against them
  # Held, so that unattended upgrades never swap the userspace libraries under a loaded module.
  local held=()
  mapfile -t held < <(dpkg-query -W -f='${db:Status-Status} ${Package}\n' "*nvidia*-$BRANCH_WANTED" \
    "*nvidia*-$BRANCH_WANTED-open" 2>/dev/null | awk '$1 == "installed" { print $2 }')
  apt-mark hold "$DRIVER_PACKAGE" "${held[@]}" >/dev/null
  DRIVER_INSTALLED=1
}

enable_persistenced() { # started now only when a driver is loaded; else from the next boot on
  if [[ -n $DRIVER_NOW ]]; then
    systemctl enable --now nvidia-persistenced
  else
    systemctl enable nvidia-persistenced
  fi
}

install_fabricmanager() {
  if ! fabricmanager_installed >/dev/null; then
    ((APT_UPDATED)) || { apt_get update && APT_UPDATED=1; }
    local name version="" names
    names=$(fabricmanager_names | paste -sd' ' -)
    for name in $names; do # a virtual package has no version of its own in madison's list
      version=$(apt-cache madison "$name" 2>/dev/null \
        | awk -F' *[|] *' -v v="$DRIVER_NOW-" 'index($2, v) == 1 { print $2; exit }' || true)
      [[ -z $version ]] || break
    done
    [[ -n $version ]] || die 1 "no fabric manager of version $DRIVER_NOW (the loaded driver's) in the apt sources: tried $names"
    local packages=("$name=$version")
    # Blackwell HGX boards (5th generation NVSwitch) also need NVIDIA's NVLink Subnet Manager
    # (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/, NVLink Subnet Manager).
    gpu_names | grep -Eq 'B[23]00' && packages+=(nvlsm)
    apt_install "${packages[@]}"
    apt-mark hold "$name" >/dev/null
  fi
  systemctl enable --now nvidia-fabricmanager
  local waited=0 state
  while state=$(fabric_state) && [[ $state != Completed ]]; do
    ((waited < FABRIC_WAIT)) \
      || die 1 "NVSwitch fabric state is '${state:-unknown}' after ${FABRIC_WAIT}s (nvidia-smi -q, Fabric); check: systemctl status nvidia-fabricmanager"
    sleep 2
    waited=$((waited + 2))
  done
  log "NVSwitch fabric: $state"
}

install_ctk() {
  if [[ ! -s $CTK_KEYRING ]] || differs "$CTK_LIST" "$(ctk_list_text)"$'\n'; then
    local dir found
    dir=$(mktemp -d)
    TEMP_PATHS+=("$dir")
    download "$CTK_KEY_URL" "$dir/key.asc" \
      || die 1 "cannot download $CTK_KEY_URL (curl exit $DOWNLOAD_RC); check the network, then run again"
    found=$(openpgp_fingerprints armor "$dir/key.asc" "$dir/key.gpg" 2>/dev/null || true)
    [[ $found == "$CTK_KEY_FINGERPRINT" ]] \
      || die 1 "$CTK_KEY_URL is not the key $CTK_KEY_FINGERPRINT (found: ${found:-no readable key}); not installed"
    install -m 0644 "$dir/key.gpg" "$CTK_KEYRING"
    write_atomic "$CTK_LIST" "$(ctk_list_text)"$'\n'
    APT_UPDATED=0
  fi
  apt_install "${CTK_PACKAGES[@]/%/=$CTK_VERSION}"
  apt-mark hold "${CTK_PACKAGES[@]}" >/dev/null
}

install_compat() { # NVIDIA's package, from its network repository (the keyring step added it)
  apt_install "$COMPAT_PACKAGE"
  [[ -d $COMPAT_DIR ]] || die 1 "$COMPAT_PACKAGE is installed but $COMPAT_DIR is missing; check: dpkg -L $COMPAT_PACKAGE"
}

compat_activate() { # appended: the venv's activate script sources it on every activation
  compat_path_line >>"$VENV/bin/activate"
}

configure_runtime() {
  nvidia-ctk runtime configure --runtime="$RUNTIME"
  systemctl restart "$RUNTIME"
}

create_venv() {
  rm -rf "$VENV"
  mkdir -p "$PREFIX"
  python3 -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(v != "3.12" and "envbuild: python3 here is " + v + ", the stack needs 3.12: use --python-url/--python-sha256 or another base")' \
   && python3 -m venv /opt/envbuild/venv
}

install_pins() {
  /opt/envbuild/venv/bin/pip install --no-cache-dir "${TORCH_PINS[@]}" --index-url "$INDEX_URL"
  if ((${#PIP_EXTRA[@]} > 0)); then
    # The user's extra packages, from pip's configured index; torch is already satisfied by the pins.
    "$VENV/bin/pip" install --no-cache-dir "${PIP_EXTRA[@]}"
  fi
}

step() { # $1 what the step does; the rest, the command: run only while the deadline allows
  ((SECONDS < DEADLINE_AT)) \
    || die 1 "the install ran past its deadline (--deadline $DEADLINE) before: $1; run again, a second run resumes"
  shift
  "$@"
}

apply() {
  ((${#APT_NEEDED[@]} == 0)) || step "installing ${APT_NEEDED[*]}" apt_install "${APT_NEEDED[@]}"
  ((!NEED_NVIDIA_REPO)) || step "NVIDIA's keyring" install_keyring
  ((!INSTALL_DRIVER)) || step "the driver" install_driver
  ((!ENABLE_PERSISTENCED)) || step "nvidia-persistenced" enable_persistenced
  ((!WRITE_UU)) || step "the unattended-upgrades blacklist" keep_uu_away
  # After the driver: should its install fail, nouveau still drives the GPU at the next boot.
  ((!WRITE_NOUVEAU)) || step "the nouveau blacklist" blacklist_nouveau
  if ((WITH_TOOLKIT)) && ! installed "$TOOLKIT_PACKAGE"; then
    step "the CUDA toolkit" apt_install "$TOOLKIT_PACKAGE"
  fi
  ((!FABRIC)) || step "the fabric manager" install_fabricmanager
  ((!CTK)) || step "the NVIDIA Container Toolkit" install_ctk
  ((!CONFIGURE_RUNTIME)) || step "the $RUNTIME runtime" configure_runtime
  ((!CDI)) || step "the CDI spec" nvidia-ctk cdi generate --output="$CDI_SPEC"
  ((!COMPAT)) || step "the forward-compatibility package" install_compat
  if ((WRITE_ENV)); then
    if [[ ${#ENV_PAIRS[@]} -gt 0 || -n $COMPAT_DIR ]]; then
      write_atomic "$ENV_FILE" "$(env_file_text)"$'\n'
    else
      rm -f "$ENV_FILE"
    fi
  fi
  venv_ready || step "the Python venv" create_venv
  ((!COMPAT_ACTIVATE)) || activate_has_compat || step "LD_LIBRARY_PATH in the venv" compat_activate
  pins_satisfied || step "the pinned packages" install_pins
  local name
  for name in envbuild.lock smoke.py; do
    if [[ -r $SOURCE_DIR/$name ]] && copy_needed "$SOURCE_DIR/$name" "$PREFIX/$name"; then
      install -D -m 0644 "$SOURCE_DIR/$name" "$PREFIX/$name"
    fi
  done
}

smoke_env() { # the --env pairs, then (forward compatibility) $COMPAT_DIR first on LD_LIBRARY_PATH
  local pair base=${LD_LIBRARY_PATH:-}
  for pair in "${ENV_PAIRS[@]}"; do
    printf '%s\0' "$pair"
    [[ $pair != LD_LIBRARY_PATH=* ]] || base=${pair#*=}
  done
  [[ -z $COMPAT_DIR ]] || printf '%s\0' "LD_LIBRARY_PATH=$COMPAT_DIR${base:+:$base}"
}

smoke() { # every check runs; the first failure's exit code is the script's
  local rc=0 code=0 failed=() envs=()
  mapfile -d '' -t envs < <(smoke_env)
  log "smoke test: $VENV/bin/python $PREFIX/smoke.py --lock $PREFIX/envbuild.lock"
  [[ -z $COMPAT_DIR ]] || log "forward compatibility: $COMPAT_DIR first on LD_LIBRARY_PATH"
  env "${envs[@]}" "$VENV/bin/python" "$PREFIX/smoke.py" --lock "$PREFIX/envbuild.lock" || rc=$?
  ((rc == 0)) || failed+=("smoke.py (exit $rc)")
  if [[ $RUNTIME == docker && -n $MIN_DRIVER && -z $SMOKE_IMAGE ]]; then
    log "GPU container: skipped (no image by digest recorded; pass --smoke-image name@sha256:<64 hex>)"
  elif [[ $RUNTIME == docker && -n $MIN_DRIVER ]] && command -v docker >/dev/null 2>&1; then
    log "GPU container: docker run --rm --runtime=nvidia --gpus all $SMOKE_IMAGE nvidia-smi -L"
    docker run --rm --runtime=nvidia --gpus all "$SMOKE_IMAGE" nvidia-smi -L || code=$?
    if ((code != 0)); then
      failed+=("GPU container (exit $code)")
      ((rc)) || rc=8
    fi
  fi
  if ((DCGM_LEVEL > 0)) && command -v dcgmi >/dev/null 2>&1; then
    code=0
    dcgmi diag -r "$DCGM_LEVEL" || code=$?
    log "dcgmi diag -r $DCGM_LEVEL: $( ((code == 0)) && echo passed || echo "failed (exit $code)")"
    if ((code != 0)); then
      failed+=("dcgmi diag -r $DCGM_LEVEL (exit $code)")
      ((rc)) || rc=7
    fi
  fi
  ((rc == 0)) || die "$rc" "smoke test failed: $(printf '%s, ' "${failed[@]}" | sed 's/, $//'); the reports above name the checks"
}

main() {
  parse_args "$@"
  DEADLINE_AT=$((SECONDS + DEADLINE))
  SOURCE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  DRIVER_INSTALLED=0
  preflight
  plan
  if ((${#PLAN[@]} == 0)); then
    log "nothing to change: the host already matches the lock"
  else
    log "plan:"
    printf '  - %s\n' "${PLAN[@]}"
  fi
  if ((DRY_RUN)); then
    log "dry run: nothing was changed"
    exit 0
  fi
  if ((${#PLAN[@]} > 0 && !ASSUME_YES)); then
    [[ -t 0 ]] || die 2 "no terminal to confirm the plan; pass --yes to run unattended"
    local answer
    read -r -p "envbuild-install: apply this plan? [y/N] " answer
    [[ $answer == [yY]* ]] || die 2 "cancelled; nothing was changed"
  fi
  apply
  if ((NOUVEAU_LOADED)); then
    log "REBOOT REQUIRED: nouveau is loaded; $NOUVEAU_CONF keeps it out from the next boot on;" \
      "reboot, then run this script again"
    exit 10
  fi
  if ((DRIVER_INSTALLED)) && [[ -e $REBOOT_FLAG || -z $(driver_version) ]]; then
    log "REBOOT REQUIRED: the new driver loads at the next boot; reboot, then run this script again"
    exit 10
  fi
  ((!RUN_SMOKE)) || smoke
  log "done"
}

main "$@"
