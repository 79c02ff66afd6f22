#!/usr/bin/env bash
# Proves scripts/gpu/build_and_test.sh on this (Debian 12, no GPU) machine under the
# conditions of a lent GPU machine: none of the Debian packages the build uses are
# installed, so the only Open MPI, ZeroMQ, protobuf, spdlog, yaml-cpp, SQLite headers,
# SentencePiece, GoogleTest, CLI11, nlohmann-json, ICU, Boost, gRPC, OpenSSL headers,
# libcurl and pkg-config are the bundle's.
#
# It debootstraps a minimal Debian 12 into /var/cache/trainyard-gpu-check/bookworm (once)
# with only what such a machine has: g++, make, cmake, ninja, python3 (for the shared
# libraries of the venv's interpreter), procps (pgrep, which two tests use) and ccache
# (speed only). Then it bind-mounts, at their own paths, this checkout (read-write),
# the torch venv and the interpreter it was made from, the CUDA toolkit
# (/usr/local/cuda, which compiles and links here but cannot run), the ccache folder,
# /proc, /sys and /dev (with /dev/shm), checks that none of the packages above is in the
# chroot, and runs build_and_test.sh there with the venv first on PATH, as the GPU
# machine's python3 is its torch venv. Logs land in ./gpu-out; the build in ./build-gpu.
# It refreshes .gpu-bundle first with scripts/gpu/bundle.sh (seconds when up to date).
# Needs root (debootstrap, chroot, mount); everything mounted is unmounted on exit.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/gpu/check_bundle_here.sh [--root DIR] [--refresh] [--no-ccache] [--shell]
                                        [-- BUILD_AND_TEST_ARGS...]

Runs scripts/gpu/build_and_test.sh in a minimal Debian 12 chroot that has a compiler,
CMake, ninja and the torch venv but none of the build's Debian packages, so the build and
the tests can only use .gpu-bundle. Needs root.

  --root DIR    the chroot (default /var/cache/trainyard-gpu-check/bookworm)
  --refresh     delete and debootstrap the chroot again
  --no-ccache   do not mount the ccache folder (a cold build)
  --shell       open a shell in the chroot, with the same mounts, instead of the run
  -h, --help    this text
Arguments after -- go to build_and_test.sh (e.g. -- --skip-build --only cpu).

Environment: TRAINYARD_VENV (default ~/.cache/trainyard/venv), TY_DEBIAN_MIRROR
(default http://deb.debian.org/debian), OUT (default ./gpu-out).
EOF
}

ROOT=/var/cache/trainyard-gpu-check/bookworm
REFRESH=0
USE_CCACHE=1
SHELL_ONLY=0
PASS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --root) [[ $# -ge 2 ]] || { echo "check_bundle_here.sh: --root needs a folder" >&2; exit 2; }; ROOT=$2; shift ;;
    --refresh) REFRESH=1 ;;
    --no-ccache) USE_CCACHE=0 ;;
    --shell) SHELL_ONLY=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; PASS=("$@"); break ;;
    *) echo "check_bundle_here.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

REPO=$(cd "$(dirname "$0")/../.." && pwd)
VENV=$(realpath -m "${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}")
MIRROR=${TY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
OUT_DIR=${OUT:-$REPO/gpu-out}
# What the lent GPU machine has besides its torch venv and CUDA toolkit. python3 brings
# the shared libraries the venv's interpreter loads (libssl, libffi, liblzma, ...).
CHROOT_PACKAGES=g++,make,cmake,ninja-build,python3,procps,ccache
# Paths that must not exist in the chroot: the build's Debian packages.
ABSENT=(/usr/include/mpi.h /usr/lib/x86_64-linux-gnu/openmpi /usr/bin/mpirun /usr/bin/orted
  /usr/include/zmq.h /usr/include/zmq.hpp /usr/include/google/protobuf /usr/bin/protoc
  /usr/include/spdlog /usr/include/fmt /usr/include/yaml-cpp /usr/include/sqlite3.h
  /usr/include/sentencepiece_processor.h /usr/include/gtest /usr/include/CLI
  /usr/include/nlohmann /usr/include/unicode /usr/bin/pkg-config /usr/bin/pkgconf
  /usr/include/boost /usr/include/grpcpp /usr/include/absl /usr/bin/grpc_cpp_plugin
  /usr/include/openssl /usr/include/x86_64-linux-gnu/curl)

log() { echo "[check] $*"; }
die() { echo "[check] error: $*" >&2; exit 1; }

MOUNTED=()
cleanup() {
  local i
  for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
    umount -R "${MOUNTED[i]}" 2> /dev/null || umount -R -l "${MOUNTED[i]}" 2> /dev/null ||
      echo "[check] warning: could not unmount ${MOUNTED[i]}" >&2
  done
}
trap cleanup EXIT

# bind SOURCE [ro]: mounts SOURCE at the same path inside the chroot.
bind() {
  local src=$1 mode=${2:-rw} dst="$ROOT$1"
  [[ -d "$src" ]] || die "$src is missing"
  mkdir -p "$dst"
  mount --rbind "$src" "$dst"
  mount --make-rslave "$dst"
  MOUNTED+=("$dst")
  if [[ $mode == ro ]]; then mount -o remount,bind,ro "$dst"; fi
}

# A crashed run may leave mounts; deleting the chroot then would reach into them.
assert_nothing_mounted() {
  if awk -v root="$ROOT/" 'index($2 "/", root) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    die "something is still mounted under $ROOT (see /proc/self/mounts): unmount it first"
  fi
}

bootstrap() {
  command -v debootstrap > /dev/null || {
    log "installing debootstrap"
    apt-get install -y -qq debootstrap > /dev/null || die "cannot install debootstrap"
  }
  assert_nothing_mounted
  if [[ $REFRESH -eq 1 && -d "$ROOT" ]]; then
    log "removing $ROOT"
    rm -rf --one-file-system "$ROOT"
  fi
  if [[ -f "$ROOT/.trainyard-check-ready" ]]; then
    log "chroot $ROOT is ready"
    return
  fi
  rm -rf --one-file-system "$ROOT"
  mkdir -p "$ROOT"
  log "debootstrapping Debian 12 into $ROOT with $CHROOT_PACKAGES (a few minutes)"
  debootstrap --variant=minbase --include="$CHROOT_PACKAGES" bookworm "$ROOT" "$MIRROR" \
    > "$ROOT.debootstrap.log" 2>&1 || { tail -n 30 "$ROOT.debootstrap.log"; die "debootstrap failed"; }
  chroot "$ROOT" apt-get clean
  [[ -s "$ROOT/etc/hosts" ]] || cp /etc/hosts "$ROOT/etc/hosts"
  touch "$ROOT/.trainyard-check-ready"
}

# Debian 12's CMake 3.25.1 stops in FindCUDAToolkit when the toolkit has no libnvToolsExt,
# as CUDA 13 does ("set_property could not find TARGET CUDA::nvToolsExt"); CMake 3.25.2
# fixed it with one condition. This machine's own copy carries that fix, so the chroot's
# gets it too (a GPU machine's newer CMake does not need it).
patch_cmake() {
  local module
  module=$(find "$ROOT/usr/share/cmake-3.25/Modules" -name FindCUDAToolkit.cmake 2> /dev/null | head -n 1)
  [[ -n "$module" ]] || return 0
  sed -i 's/^    if(CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)$/    if(TARGET CUDA::nvToolsExt AND CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)/' "$module"
}

check_isolation() {
  local p present=()
  for p in "${ABSENT[@]}"; do
    [[ -e "$ROOT$p" ]] && present+=("$p")
  done
  [[ ${#present[@]} -eq 0 ]] || die "the chroot has what only the bundle may provide: ${present[*]}"
  log "none of the build's Debian packages is in the chroot (checked ${#ABSENT[@]} paths)"
}

mount_all() {
  mkdir -p "$ROOT/proc" && mount -t proc proc "$ROOT/proc" && MOUNTED+=("$ROOT/proc")
  bind /sys ro
  bind /dev
  bind "$REPO"
  [[ -x "$VENV/bin/python3" ]] || die "no torch venv at $VENV (TRAINYARD_VENV)"
  bind "$VENV" ro
  # The interpreter the venv was made from (pyvenv.cfg's home), unless it is Debian's own.
  local home
  home=$(awk -F' = ' '$1 == "home" { print $2 }' "$VENV/pyvenv.cfg")
  home=$(realpath -m "$home/..")
  case "$home" in
    /usr|/usr/local) log "the venv's interpreter is the chroot's own python3 ($home)" ;;
    *) bind "$home" ro ;;
  esac
  local cuda
  cuda=$(realpath -e /usr/local/cuda) || die "no CUDA toolkit at /usr/local/cuda"
  bind "$cuda" ro
  [[ "$cuda" == /usr/local/cuda ]] || ln -sfn "$cuda" "$ROOT/usr/local/cuda"
  if [[ $USE_CCACHE -eq 1 ]] && command -v ccache > /dev/null; then
    CCACHE_DIR_HOST=$(ccache --get-config cache_dir)
    mkdir -p "$CCACHE_DIR_HOST"
    bind "$CCACHE_DIR_HOST"
  fi
}

main() {
  [[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, mount)"
  "$REPO/scripts/gpu/bundle.sh"
  bootstrap
  patch_cmake
  check_isolation
  mount_all
  local env=(HOME=/root USER=root LANG=C.UTF-8 OUT="$OUT_DIR"
    PATH="$VENV/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
  [[ -n "${CCACHE_DIR_HOST:-}" ]] && env+=(CCACHE_DIR="$CCACHE_DIR_HOST")
  if [[ $SHELL_ONLY -eq 1 ]]; then
    chroot "$ROOT" /usr/bin/env -i "${env[@]}" bash -c "cd '$REPO' && exec bash"
    return
  fi
  log "running scripts/gpu/build_and_test.sh ${PASS[*]} in the chroot"
  local t0=$SECONDS rc=0
  # shellcheck disable=SC2016  # expanded by the chroot's bash
  chroot "$ROOT" /usr/bin/env -i "${env[@]}" bash -c 'cd "$1" && shift && exec scripts/gpu/build_and_test.sh "$@"' \
    bash "$REPO" "${PASS[@]}" || rc=$?
  log "build_and_test.sh exited $rc after $((SECONDS - t0)) s; logs in $OUT_DIR"
  return $rc
}

main
