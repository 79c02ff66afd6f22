#!/usr/bin/env bash
# Builds Trainyard and runs its tests on a machine that has a compiler, CMake, ninja and
# a Python with the torch wheel, but none of the Debian packages the build uses: a lent
# GPU machine, or your own box without Internet or root. Those packages come from
# .gpu-bundle/, which scripts/gpu/bundle.sh makes on a Debian 12 machine. Run it from a
# copy of the repository that holds .gpu-bundle/, as root or not (without root, unless
# /usr/share/games/fortunes exists, the tokenizer_parity test fails: it reads them there).
#
# What it does, each step logged under $OUT (default ./gpu-out), seven files at most:
#   facts.txt      OS, glibc, compilers, CMake, nvcc, nvidia-smi, python/torch, which
#                  bundled libraries the system already has, ldd of the built binaries
#   unpack.log     unpacking the bundle
#   configure.log  CMake, against the unpacked bundle (build dir: ./build-gpu)
#   build.log      ninja on every core
#   ctest-gpu.log  `ctest -L gpu -V` (tests labelled gpu, verbose: their measured errors)
#   ctest-cpu.log  `ctest -LE gpu` (everything else)
#   summary.txt    one line per step: status and seconds
# and exits 1 if any step failed.
#
# How the bundle is used: deps.tar.xz is unpacked (with Python's tarfile, no xz binary
# needed) into build-gpu/deps, once per bundle; data.tar.xz fills data/prepared if it is
# missing, and the bundle's fortunes are copied to /usr/share/games/fortunes if that is
# missing and writable. The wheels (the gpu tests' Python clients) are installed with
# pip, offline, into build-gpu/site, which env.sh puts first on PYTHONPATH. CMake looks in build-gpu/deps first (CMAKE_PREFIX_PATH, protoc,
# the mpicxx wrapper, pkgconf) and takes torch from `python3` on PATH
# (-DTRAINYARD_PYTHON). Open MPI and PMIx are relocated with OPAL_PREFIX/OPAL_SYSCONFDIR
# and PMIX_PREFIX/PKGLIBDIR/PKGDATADIR. At run time build-gpu/deps-lib, on
# LD_LIBRARY_PATH, holds links to Open MPI's and PMIx's own libraries and to those other
# bundled libraries whose soname the system lacks (per `ldconfig -p`), so where the
# system has one (libudev, libbsd, krb5, ...) its own, possibly newer, copy is loaded.
# (The libraries our binaries link directly are found through their RUNPATH, which CMake
# points at the bundle: the copies whose headers they were compiled with.) mpirun runs
# as root, oversubscribed, launching locally without ssh (plm=isolated), over shared
# memory or TCP.
#
# A warm machine keeps build-gpu/ between calls: --skip-build runs the tests on the
# existing build, --only gpu runs just the gpu-labelled tests. `source build-gpu/env.sh`
# sets the same run-time environment in a shell, to run build-gpu/bin/* by hand.
# shellcheck disable=SC2317  # the steps are called through run_step
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/gpu/build_and_test.sh [options]

Unpacks .gpu-bundle/, configures and builds Trainyard against it into build-gpu/, then
runs `ctest -L gpu` and `ctest -LE gpu`. Logs go to $OUT (default ./gpu-out).

  --skip-build        reuse build-gpu/ as it is (no unpack, configure or build)
  --only WHAT         tests to run: all (default), gpu, cpu, or none (build only)
  -R, --tests-regex R run only the tests matching R (passed to both ctest calls)
  --jobs N            build jobs (default: all cores)
  --target T          build only ninja target T (e.g. worker), with --only none
  --test-jobs N       parallel ctest jobs for the cpu tests (default: cores/2, 2..8);
                      gpu tests run one at a time unless TY_GPU_TEST_JOBS says
  -h, --help          this text

Environment: OUT (log folder), TY_GPU_SKIP_BUILD=1 and TY_GPU_ONLY=WHAT (as the
options), TY_GPU_BUILD_DIR (default ./build-gpu), TY_GPU_BUNDLE (default ./.gpu-bundle),
TORCH_CUDA_ARCH_LIST (default 9.0), TY_GPU_TEST_TIMEOUT (seconds per test, default 600),
TY_GPU_TEST_JOBS (gpu tests at a time, default 1; RUN_SERIAL tests still run alone).
EOF
}

die_usage() { echo "build_and_test.sh: $*" >&2; exit 2; }

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT_DIR=${OUT:-$REPO/gpu-out}
BUILD=${TY_GPU_BUILD_DIR:-$REPO/build-gpu}
BUNDLE=${TY_GPU_BUNDLE:-$REPO/.gpu-bundle}
SKIP_BUILD=${TY_GPU_SKIP_BUILD:-0}
ONLY=${TY_GPU_ONLY:-all}
REGEX=""
TARGETS=()
CORES=$(nproc)
JOBS=$CORES
TEST_JOBS=$(( CORES / 2 < 2 ? 2 : (CORES / 2 > 8 ? 8 : CORES / 2) ))

while [[ $# -gt 0 ]]; do
  case "$1" in
    --skip-build) SKIP_BUILD=1 ;;
    --only) [[ $# -ge 2 ]] || die_usage "--only needs a value"; ONLY=$2; shift ;;
    -R|--tests-regex) [[ $# -ge 2 ]] || die_usage "$1 needs a value"; REGEX=$2; shift ;;
    --target) [[ $# -ge 2 ]] || die_usage "--target needs a value"; TARGETS+=("$2"); shift ;;
    --jobs) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "--jobs needs a number"; JOBS=$2; shift ;;
    --test-jobs) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "--test-jobs needs a number"; TEST_JOBS=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
case "$ONLY" in all|gpu|cpu|none) ;; *) die_usage "--only: expected all, gpu, cpu or none, got '$ONLY'" ;; esac
[[ "$SKIP_BUILD" =~ ^[01]$ ]] || die_usage "TY_GPU_SKIP_BUILD: expected 0 or 1, got '$SKIP_BUILD'"

DEPS=$BUILD/deps
PRIVATE_LIB=$BUILD/deps-lib
ARCH_LIB=$DEPS/usr/lib/x86_64-linux-gnu
PY=$(command -v python3 || true)
mkdir -p "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
: > "$SUMMARY"
FAILED=0
START=$SECONDS

say() { echo "[gpu $(date -u +%H:%M:%S)] $*"; }
record() {  # step status seconds [detail]
  printf '%-10s %-7s %5ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$SUMMARY"
  [[ "$2" == ok || "$2" == skipped ]] || FAILED=1
}

# Runs "$@" with its output in LOG; records the step; on failure shows the log's tail.
run_step() {
  local name=$1 log=$2; shift 2
  local t0=$SECONDS rc=0
  say "$name: $*  (log: $log)"
  "$@" >> "$log" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then
    record "$name" ok $((SECONDS - t0))
  else
    record "$name" FAILED $((SECONDS - t0)) "exit $rc"
    echo "----- last lines of $log -----"; tail -n 40 "$log"; echo "-----"
  fi
  return $rc
}

# --- Machine facts -------------------------------------------------------------------
first_line() { "$@" 2>&1 | head -n 1 || true; }
facts() {
  echo "date:      $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host:      $(uname -n), kernel $(uname -r), $CORES cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory, user $(id -un)"
  # shellcheck disable=SC1091
  echo "os:        $( (. /etc/os-release && echo "$PRETTY_NAME") 2> /dev/null || echo unknown)"
  echo "glibc:     $(getconf GNU_LIBC_VERSION 2> /dev/null || echo unknown)"
  echo "/dev/shm:  $(df -h --output=size,avail /dev/shm 2> /dev/null | tail -n 1 | awk '{ print $1 " size, " $2 " free" }') (MPI shared memory, NCCL)"
  echo "c++:       $(command -v c++ || echo none): $(first_line c++ --version)"
  echo "g++:       $(command -v g++ || echo none): $(first_line g++ --version)"
  echo "libstdc++: $(ldconfig -p 2> /dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ { print $NF; exit }' | xargs -r readlink -f)"
  echo "cmake:     $(first_line cmake --version)"
  echo "ninja:     $(first_line ninja --version)"
  echo "ccache:    $(first_line ccache --version)"
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  echo "nvcc:      $nvcc: $("$nvcc" --version 2> /dev/null | grep -i release || echo none)"
  if command -v nvidia-smi > /dev/null; then
    echo "nvidia-smi: $(nvidia-smi 2>&1 | grep -m1 'Driver Version' | tr -s ' ' || true)"
    echo "gpus:      $(nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | paste -sd';')"
  else
    echo "nvidia-smi: none"
  fi
  echo "python3:   ${PY:-none}"
  "$PY" - <<'PYFACTS' 2>&1 || true
import importlib.metadata as md
import os, platform, sys
print(f"python:    {platform.python_version()} ({sys.prefix})")
for pkg in ("torch", "transformers", "tokenizers", "safetensors", "numpy", "nvidia-nccl-cu13"):
    try:
        print(f"{pkg + ':':11}{md.version(pkg)}")
    except md.PackageNotFoundError:
        print(f"{pkg + ':':11}not installed")
try:
    import torch
    line = f"torch:     {torch.__version__}, built for CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}"
    if torch.cuda.is_available():
        line += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (sm_{''.join(map(str, torch.cuda.get_device_capability(0)))})"
        line += f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    print(line)
    print(f"torch dir: {os.path.dirname(torch.__file__)}")
except Exception as e:  # the facts must not stop the run
    print(f"torch:     import failed: {e}")
PYFACTS
  command -v pgrep > /dev/null || echo "missing:   pgrep (procps): the ddp_hang and ddp_kill tests use it"
  echo "bundle:    $BUNDLE"
  if [[ -f "$BUNDLE/MANIFEST.txt" ]]; then sed -n '2,4p' "$BUNDLE/MANIFEST.txt" | sed 's/^/  /'; fi
}

# --- The bundle ------------------------------------------------------------------------
extract() {  # TARBALL DEST
  "$PY" - "$1" "$2" <<'PYX'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    # "tar" keeps the bundle's relative symlinks; "data" would refuse some of them.
    t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
PYX
}

unpack_bundle() {
  [[ -f "$BUNDLE/deps.tar.xz" && -f "$BUNDLE/data.tar.xz" ]] ||
    { echo "no $BUNDLE/deps.tar.xz or data.tar.xz: run scripts/gpu/bundle.sh on Debian 12 and carry .gpu-bundle"; return 1; }
  local sum
  sum=$(sha256sum "$BUNDLE/deps.tar.xz" | cut -d' ' -f1)
  if [[ -f "$DEPS/.unpacked" && "$(cat "$DEPS/.unpacked")" == "$sum" ]]; then
    echo "deps: already unpacked in $DEPS"
  else
    echo "deps: unpacking $BUNDLE/deps.tar.xz into $DEPS"
    rm -rf "$DEPS" && mkdir -p "$DEPS"
    extract "$BUNDLE/deps.tar.xz" "$DEPS"
    echo "$sum" > "$DEPS/.unpacked"
  fi
  local f
  for f in langid/train.tsv langid/dev.tsv langid/test.tsv langid/vocab.txt langid/labels.txt \
           topics/train.tsv topics/dev.tsv topics/test.tsv topics/vocab.txt topics/labels.txt; do
    if [[ ! -f "data/prepared/$f" ]]; then
      echo "data: unpacking $BUNDLE/data.tar.xz into data/prepared"
      extract "$BUNDLE/data.tar.xz" "$REPO"
      break
    fi
  done
  du -sh "$DEPS"
  install_fortunes
  install_wheels
}

# The wheels go to their own folder, not the image's Python, which stays as it was.
install_wheels() {
  local wheels=("$BUNDLE"/wheels/*.whl) sum
  [[ -f "${wheels[0]}" ]] || { echo "wheels: none in $BUNDLE/wheels (serve_gpu needs tritonclient)"; return 0; }
  sum=$(sha256sum "${wheels[@]}" | sha256sum | cut -d' ' -f1)
  if [[ -f "$BUILD/site/.installed" && "$(cat "$BUILD/site/.installed")" == "$sum" ]]; then
    echo "wheels: already installed in $BUILD/site"
    return 0
  fi
  rm -rf "$BUILD/site" && mkdir -p "$BUILD/site"
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$BUILD/site" "${wheels[@]}"; then
    # Not fatal: the build and every other test go on; serve_gpu fails on its imports.
    echo "wheels: $("$PY" -V 2>&1) could not install them (bundle.sh made them for another Python?): serve_gpu will fail"
    rm -rf "$BUILD/site"
    return 0
  fi
  echo "$sum" > "$BUILD/site/.installed"
  echo "wheels: installed ${#wheels[@]} into $BUILD/site"
}

# tests/reference/tokenizer_parity.py reads the fortunes from /usr/share/games/fortunes.
install_fortunes() {
  local dest=/usr/share/games/fortunes
  if [[ -d "$dest" ]]; then
    echo "fortunes: $dest is there"
  elif mkdir -p "$(dirname "$dest")" 2> /dev/null && cp -a "$DEPS/usr/share/games/fortunes" "$dest" 2> /dev/null; then
    echo "fortunes: copied the bundle's into $dest (tokenizer_parity reads them there)"
  else
    echo "fortunes: cannot write $dest (not root?): tokenizer_parity will fail"
  fi
}

# Links into PRIVATE_LIB Open MPI's and PMIx's libraries (one unit with the bundle's
# mpirun and MCA components) and the other bundled libraries the system lacks.
ALWAYS_BUNDLED='^lib(mpi|mpi_cxx|open-pal|open-rte|mca_common_[a-z]+|pmix)\.so\.'
make_private_libdir() {
  local system lib soname used=() skipped=()
  system=" $(ldconfig -p 2> /dev/null | awk '/x86-64/ { print $1 }' | sort -u | tr '\n' ' ') "
  rm -rf "$PRIVATE_LIB" && mkdir -p "$PRIVATE_LIB"
  for lib in "$ARCH_LIB"/lib*.so.* "$ARCH_LIB"/pmix2/lib/libpmix.so.*; do
    [[ -f "$lib" && ! -L "$lib" ]] || continue
    soname=$(readelf -d "$lib" 2> /dev/null | awk '/\(SONAME\)/ { gsub(/[][]/, "", $5); print $5 }')
    [[ -n "$soname" ]] || continue
    if [[ "$system" == *" $soname "* && ! "$soname" =~ $ALWAYS_BUNDLED ]]; then
      skipped+=("$soname")
    else
      ln -sfn "$lib" "$PRIVATE_LIB/$soname"
      used+=("$soname")
    fi
  done
  echo "bundled libraries used (${#used[@]}): ${used[*]}"
  echo "system copies used instead of the bundle's (${#skipped[@]}): ${skipped[*]:-none}"
}

# Writes build-gpu/env.sh, the run-time environment of the bundle's libraries and
# Open MPI, and sources it. `source build-gpu/env.sh` gives a shell the same, to run
# build-gpu/bin/* (or scripts/gpu/measure.sh with TRAINYARD_BIN=build-gpu/bin) by hand.
mpi_environment() {
  mkdir -p "$BUILD"
  {
    echo "# Made by scripts/gpu/build_and_test.sh: the environment its builds and tests run in."
    # shellcheck disable=SC2016  # expanded when env.sh is sourced
    printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$PRIVATE_LIB"
    # shellcheck disable=SC2016
    printf 'export PATH="$PATH":%q  # after the system'"'"'s tools\n' "$DEPS/usr/bin"
    printf 'export OPAL_PREFIX=%q OPAL_SYSCONFDIR=%q\n' "$DEPS/usr" "$DEPS/etc/openmpi"
    # shellcheck disable=SC2016
    [[ -d "$BUILD/site" ]] && printf 'export PYTHONPATH=%q"${PYTHONPATH:+:$PYTHONPATH}"  # the bundle'"'"'s wheels\n' "$BUILD/site"
    echo "# PMIx relocates its prefix but not these two (Debian sets them as absolute paths)."
    printf 'export PMIX_PREFIX=%q PMIX_PKGLIBDIR=%q PMIX_PKGDATADIR=%q\n' \
      "$ARCH_LIB/pmix2" "$ARCH_LIB/pmix2/lib/pmix" "$ARCH_LIB/pmix2/share/pmix"
    cat <<'ENV'
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated  # every rank is local: no ssh/rsh needed (the cluster tests ask for rsh)
python3 -c 'import peft' 2> /dev/null || export TRAINYARD_TESTS_WITHOUT_PEFT=1  # the LoRA parity tests skip
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers often forbid CMA
export OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_mca_base_component_show_load_errors=0
ENV
  } > "$BUILD/env.sh"
  # shellcheck disable=SC1091
  source "$BUILD/env.sh"
}

# Boost, gRPC and libcurl are the bundle's (Debian 12's), named exactly, so that a GPU
# image's own copies, which the project is not tested with, are never picked. Where this
# machine's newer compiler rejects the bundle's Boost.Beast or gRPC headers, CMake leaves
# serving's front end (and, for Boost, the dashboard) out and says so in configure.log,
# rather than failing the build the GPU tests need.
configure() {
  local arch=${TORCH_CUDA_ARCH_LIST:-9.0}
  cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTRAINYARD_GPU_BUNDLE=ON \
    -DBoost_DIR="$ARCH_LIB/cmake/Boost-1.74.0" -DBoost_NO_SYSTEM_PATHS=ON \
    -DCURL_NO_CURL_CMAKE=ON -DCURL_INCLUDE_DIR="$DEPS/usr/include/x86_64-linux-gnu" -DCURL_LIBRARY="$ARCH_LIB/libcurl.so" \
    -DTRAINYARD_PYTHON="$PY" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" \
    -DICU_ROOT="$DEPS/usr" \
    -DPKG_CONFIG_EXECUTABLE="$DEPS/usr/bin/pkgconf" \
    -DProtobuf_PROTOC_EXECUTABLE="$DEPS/usr/bin/protoc" \
    -DMPI_CXX_COMPILER="$DEPS/usr/bin/mpicxx.openmpi" \
    -DMPIEXEC_EXECUTABLE="$DEPS/usr/bin/mpirun.openmpi" \
    -DTORCH_CUDA_ARCH_LIST="$arch"
}

# The bundle's tools must run here: this fails on a glibc older than Debian 12's (2.36)
# unless the system has its own copies of the libraries that need it.
check_bundle_tools() {
  local tool bad=0
  local out
  for tool in protoc grpc_cpp_plugin orterun opal_wrapper pkgconf; do
    out=$(ldd "$DEPS/usr/bin/$tool" 2>&1) || bad=1
    echo "ldd $tool:"; echo "$out"
    if grep -q 'not found' <<< "$out"; then bad=1; fi
  done
  [[ $bad -eq 0 ]] || return 1
  "$DEPS/usr/bin/protoc" --version
  "$DEPS/usr/bin/mpirun.openmpi" --version | head -n 1
}

# The binaries must find every library (a bundled one, the system's, or torch's).
check_binaries() {
  local bin bad=0
  for bin in "$BUILD"/bin/*; do
    if ldd "$bin" 2>&1 | grep -E 'not found|version .* not found'; then
      echo "$bin: unresolved libraries"; bad=1
    fi
  done
  ldd "$BUILD/bin/worker" | grep -E 'libmpi|libzmq|libyaml|libspdlog|libsentencepiece|libicuuc|libnccl|libtorch_cuda|libstdc'
  return $bad
}

run_ctest() {  # NAME LOG CTEST-ARGS...
  local name=$1 log=$2; shift 2
  local t0=$SECONDS rc=0 result
  local args=(--test-dir "$BUILD" --output-on-failure --no-tests=ignore --timeout "${TY_GPU_TEST_TIMEOUT:-600}" "$@")
  [[ -n "$REGEX" ]] && args+=(-R "$REGEX")
  say "$name: ctest ${args[*]}  (log: $log)"
  ctest "${args[@]}" > "$log" 2>&1 || rc=$?
  result=$(grep -E 'tests passed|No tests were found' "$log" | tail -n 1 || true)
  [[ -n "$result" || $rc -ne 0 ]] || result="no tests matched"
  local skipped
  skipped=$(grep -c '^[[:space:]]*[0-9]* - .*(Skipped)$' "$log" || true)
  [[ $skipped -eq 0 ]] || result+=" ($skipped skipped)"
  if [[ $rc -eq 0 ]]; then
    record "$name" ok $((SECONDS - t0)) "$result"
  else
    record "$name" FAILED $((SECONDS - t0)) "${result:-exit $rc}"
    sed -n '/The following tests FAILED/,$p' "$log" | head -n 40
  fi
}

main() {
  [[ -n "$PY" ]] || { echo "build_and_test.sh: no python3 on PATH (it must be the Python with torch)" >&2; exit 1; }
  say "repository $REPO, build $BUILD, logs $OUT_DIR"
  local f
  for f in facts.txt unpack.log configure.log build.log ctest-gpu.log ctest-cpu.log; do rm -f "${OUT_DIR:?}/$f"; done
  facts | tee "$OUT_DIR/facts.txt"
  if [[ $SKIP_BUILD -eq 0 ]]; then
    run_step unpack "$OUT_DIR/unpack.log" unpack_bundle || true
  else
    [[ -f "$BUILD/build.ninja" && -d "$DEPS" ]] || { echo "--skip-build: no configured $BUILD with its deps" >&2; exit 1; }
    record unpack skipped 0 "--skip-build"
  fi
  make_private_libdir | tee -a "$OUT_DIR/facts.txt"
  mpi_environment
  [[ $FAILED -eq 0 ]] && { run_step tools "$OUT_DIR/unpack.log" check_bundle_tools || true; }
  if [[ $SKIP_BUILD -eq 0 && $FAILED -eq 0 ]]; then
    if run_step configure "$OUT_DIR/configure.log" configure; then
      grep -E '^-- Trainyard:' "$OUT_DIR/configure.log" || true
    fi
    [[ $FAILED -eq 0 ]] && { run_step build "$OUT_DIR/build.log" ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" || true; }
  elif [[ $SKIP_BUILD -eq 1 ]]; then
    record configure skipped 0 "--skip-build"; record build skipped 0 "--skip-build"
  fi
  if [[ $FAILED -eq 0 ]]; then
    { echo "--- ldd of the built binaries"; check_binaries; } >> "$OUT_DIR/facts.txt" 2>&1 ||
      { record libraries FAILED 0 "unresolved libraries (facts.txt)"; }
  fi
  if [[ $FAILED -eq 0 ]]; then
    [[ "$ONLY" == all || "$ONLY" == gpu ]] && run_ctest ctest-gpu "$OUT_DIR/ctest-gpu.log" -L gpu -j"${TY_GPU_TEST_JOBS:-1}" -V
    [[ "$ONLY" == all || "$ONLY" == cpu ]] && run_ctest ctest-cpu "$OUT_DIR/ctest-cpu.log" -LE gpu -j"$TEST_JOBS"
  fi
  record total "$([[ $FAILED -eq 0 ]] && echo ok || echo FAILED)" $((SECONDS - START))
  exit $FAILED
}

main
