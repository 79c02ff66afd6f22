#!/usr/bin/env bash
# Packs what a GPU machine without Internet (or without root) needs to build and test
# Trainyard, into .gpu-bundle/ at the repository root (git-ignored). Run it on a
# Debian 12 (bookworm) machine with apt sources; it needs no root and installs nothing.
#
# The GPU machines lent to this project have a compiler, CMake, ninja, nvcc and a Python
# with the torch wheel, but none of the Debian packages the build uses (Open MPI, ZeroMQ,
# protobuf, spdlog/fmt, yaml-cpp, SQLite, SentencePiece, GoogleTest, CLI11, nlohmann-json,
# ICU, Boost, gRPC, libcurl). This script
#   1. fetches the Debian 12 packages listed below with `apt-get download` into a cache
#      (~/.cache/trainyard/gpu-bundle, or TY_GPU_BUNDLE_CACHE); the list was derived from
#      `ldd` of the built binaries, the headers and CMake/pkg-config files the build
#      reads, and `readelf -d` of every shared object it keeps. If this machine's apt
#      lists lack a package, a private apt state in the cache is updated instead;
#   2. unpacks them with `dpkg -x` into one tree and prunes what the build and tests do
#      not use: documentation, man pages, Fortran/Java/OpenSHMEM parts of Open MPI, MCA
#      components whose libraries (UCX, libfabric, verbs, PSM, libnl) are not bundled,
#      and static libraries except the ones CMake links: libprotobuf.a (the worker links
#      protobuf statically) and GoogleTest's four (GTestTargets.cmake names them all);
#      it makes every symlink relative and every .pc file relative to its own folder, so
#      the tree works wherever it is unpacked, then checks that each kept shared object
#      finds its libraries inside the tree or in a base system (glibc, libstdc++, zlib);
#   3. adds the prepared datasets (data/prepared, made by scripts/prepare_data.py with
#      the venv's python if missing), since the GPU machine has no fortunes packages;
#      the fortunes themselves are in the tree too (usr/share/games/fortunes), for the
#      test that reads them from /usr/share/games/fortunes;
#   4. downloads, as wheels for the GPU image's Python (GPU_PYTHON), the Python packages
#      the gpu tests import that the image lacks: serve_gpu's clients, tritonclient with
#      its HTTP and gRPC dependencies, in the venv's versions (the ones the CPU suite is
#      tested with) into .gpu-bundle/wheels.
#
# Why compressed: the carried files may total 64 MiB, the repository included. The
# pruned tree is ~175 MiB unpacked (30 MiB of it ICU's libicudata, 30 MiB Boost headers,
# 20 MiB fortunes), so it is stored as .gpu-bundle/deps.tar.xz with xz -9, which packed
# the tree without Boost, gRPC and curl into 23 MiB, against 34 MiB with gzip -9 and
# 26 MiB with zstd -19; Python's tarfile reads xz, so the GPU machine needs no xz binary.
# The data goes in .gpu-bundle/data.tar.xz, so a new dataset does not recompress the
# rest. MANIFEST.txt lists the packages and versions. scripts/gpu/build_and_test.sh
# unpacks both on the GPU machine.
#
# Idempotent: the .debs are cached and checked against apt's SHA-256, and a tarball is
# rebuilt only when its inputs (package files, this script, the data files) change, so
# a second run takes seconds. It ends by printing the carried size (.gpu-bundle plus
# the files of the working tree that travel with it) and fails if that is over budget.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/gpu/bundle.sh [--force] [--budget-mib N]

Makes .gpu-bundle/ (deps.tar.xz, data.tar.xz, wheels/, MANIFEST.txt, .stamps) for
scripts/gpu/build_and_test.sh on a GPU machine. Run on Debian 12; no root needed.

  --force          rebuild the tarballs even if their inputs did not change
  --budget-mib N   fail if .gpu-bundle plus the working tree's carried files exceed
                   N MiB (default 64)
  -h, --help       this text

Environment: TY_GPU_BUNDLE_CACHE (default ~/.cache/trainyard/gpu-bundle) holds the
downloaded .debs and the unpacked tree; TRAINYARD_VENV is the venv whose python runs
scripts/prepare_data.py when data/prepared is missing.
EOF
}

FORCE=0
BUDGET_MIB=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --force) FORCE=1 ;;
    --budget-mib)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "bundle.sh: --budget-mib needs a number" >&2; exit 2; }
      BUDGET_MIB=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

REPO=$(cd "$(dirname "$0")/../.." && pwd)
SELF="$REPO/scripts/gpu/bundle.sh"
CACHE="${TY_GPU_BUNDLE_CACHE:-$HOME/.cache/trainyard/gpu-bundle}"
VENV="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}"
BUNDLE="$REPO/.gpu-bundle"
ARCH_LIB=usr/lib/x86_64-linux-gnu

# The Debian 12 packages, runtime and development parts. Grouped by what needs them.
PACKAGES=(
  # Open MPI 4.1 (mpirun/orted, libmpi, mpi.h, the mpicxx wrapper CMake interrogates)
  # and what its libraries and kept components load: PMIx (needs libmunge), hwloc,
  # libevent, libudev.
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
  libpmix2 libmunge2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libudev1
  # ZeroMQ and cppzmq; libzmq5 loads libsodium, OpenPGM, NORM, GSSAPI (krb5) and libbsd.
  libzmq5 libzmq3-dev cppzmq-dev
  libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  # protobuf: headers, libprotobuf.a (linked statically), protoc and its libraries.
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  # The rest of the C++ dependencies.
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libyaml-cpp-dev libyaml-cpp0.7
  libsqlite3-dev libsqlite3-0
  libsentencepiece-dev libsentencepiece0
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev
  libre2-dev libre2-9
  libicu-dev libicu72
  # Serving's front end and the dashboard: Boost's headers (Beast, Asio), pruned to what
  # the sources include (prune_boost); gRPC 1.51 with grpc_cpp_plugin, Abseil, c-ares,
  # OpenSSL and zlib, which its libraries and pkg-config files name.
  libboost1.74-dev
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libabsl-dev libabsl20220623 libc-ares-dev libc-ares2 libssl-dev libssl3 zlib1g-dev zlib1g
  # MLflow logging: libcurl and what it loads (HTTP/2, IDN, LDAP, RTMP, SSH, PSL, brotli,
  # zstd; LDAP brings SASL, RTMP GnuTLS and its crypto, SSH libgcrypt).
  libcurl4-openssl-dev libcurl4 libnghttp2-14 libidn2-0 libunistring2 libldap-2.5-0
  libsasl2-2 librtmp1 libgnutls30 libhogweed6 libnettle8 libgmp10
  libp11-kit0 libffi8 libtasn1-6 libssh2-1 libgcrypt20 libgpg-error0 libpsl5 libbrotli1 libzstd1
  # pkg-config, which CMake runs for SentencePiece (and cppzmq for libzmq).
  pkgconf pkgconf-bin libpkgconf3
  # Test data: tests/reference/tokenizer_parity.py reads /usr/share/games/fortunes.
  fortunes fortunes-min fortunes-de fortunes-it fortunes-es fortunes-br fortunes-pl fortunes-ru
  fortunes-cs fortunes-eo fortunes-zh
)

# The gpu tests' Python packages the GPU image lacks (KINDS.md's package list of the
# device tool: it has grpcio and protobuf, but not in the versions tritonclient's gRPC
# stubs were tested with here), and that Python's version.
WHEELS=(tritonclient python-rapidjson geventhttpclient gevent greenlet zope.event zope.interface brotli
        grpcio protobuf)
GPU_PYTHON=3.12
# pip matches a wheel's manylinux tag exactly: the tags these packages publish.
WHEEL_PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
                 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)

# Shared objects any glibc-based machine that compiles C++ has; everything else a kept
# library needs must be in the bundle.
BASE_SONAMES=" linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0
  librt.so.1 libutil.so.1 libresolv.so.2 libstdc++.so.6 libgcc_s.so.1 libz.so.1 "

log() { echo "[bundle] $*"; }
# .gpu-bundle/.stamps: "KEY VALUE" lines recording what each tarball was made from.
stamp_get() { awk -v k="$1" '$1 == k { print $2 }' "$BUNDLE/.stamps" 2> /dev/null || true; }
stamp_set() {
  mkdir -p "$BUNDLE"
  { grep -v "^$1 " "$BUNDLE/.stamps" 2> /dev/null || true; echo "$1 $2"; } > "$BUNDLE/.stamps.tmp"
  mv "$BUNDLE/.stamps.tmp" "$BUNDLE/.stamps"
}
die() { echo "[bundle] error: $*" >&2; exit 1; }

check_host() {
  local id="" codename=""
  # shellcheck disable=SC1091
  [[ -r /etc/os-release ]] && { id=$(. /etc/os-release; echo "${ID:-}"); codename=$(. /etc/os-release; echo "${VERSION_CODENAME:-}"); }
  [[ "$id" == debian && "$codename" == bookworm ]] ||
    die "run this on Debian 12 (bookworm): the package list is bookworm's (this is '$id $codename')"
  local tool
  for tool in apt-get dpkg-deb sha256sum tar xz readelf git c++; do
    command -v "$tool" > /dev/null || die "'$tool' is missing"
  done
}

# APT_OPTS: empty (the system's apt state) or a private state in the cache.
APT_OPTS=()
use_private_apt_state() {
  local state="$CACHE/apt"
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
  APT_OPTS=(-o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
            -o "Dir::State::status=/var/lib/dpkg/status" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)")
  if ! compgen -G "$state/lists/*_Packages*" > /dev/null; then
    log "this machine's apt lists lack some packages: updating a private apt state in $state"
    apt-get "${APT_OPTS[@]}" update -qq || die "apt-get update (private state in $state) failed"
  fi
}

# Prints "FILE SHA256" for each package, as apt would download it now.
resolve_packages() {
  local uris
  if ! uris=$(apt-get "${APT_OPTS[@]}" download --print-uris "${PACKAGES[@]}" 2> "$CACHE/apt-resolve.err"); then
    return 1
  fi
  awk '{ sub(/^SHA256:/, "", $4); print $2, $4 }' <<< "$uris" | sort
}

fetch_debs() {
  mkdir -p "$CACHE/debs"
  local resolved
  if ! resolved=$(resolve_packages); then
    use_private_apt_state
    resolved=$(resolve_packages) || { cat "$CACHE/apt-resolve.err" >&2; die "apt cannot resolve the package list"; }
  fi
  [[ $(wc -l <<< "$resolved") -eq ${#PACKAGES[@]} ]] ||
    die "apt resolved $(wc -l <<< "$resolved") files for ${#PACKAGES[@]} packages"
  local missing=() file sha pkg
  while read -r file sha; do
    if [[ ! -f "$CACHE/debs/$file" ]] || ! echo "$sha  $CACHE/debs/$file" | sha256sum -c --status; then
      pkg=${file%%_*}
      missing+=("$pkg")
    fi
  done <<< "$resolved"
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "downloading ${#missing[@]} packages into $CACHE/debs"
    (cd "$CACHE/debs" && apt-get "${APT_OPTS[@]}" download -q "${missing[@]}" > /dev/null 2>&1) ||
      (cd "$CACHE/debs" && apt-get "${APT_OPTS[@]}" download "${missing[@]}") || die "apt-get download failed"
  else
    log "all ${#PACKAGES[@]} packages already in $CACHE/debs"
  fi
  while read -r file sha; do
    echo "$sha  $CACHE/debs/$file" | sha256sum -c --status || die "$file does not match apt's SHA-256"
  done <<< "$resolved"
  DEB_FILES=$(awk '{print $1}' <<< "$resolved")
  DEB_LIST="$resolved"
}

# --- Pruning ---------------------------------------------------------------------------
prune_tree() {
  local root=$1
  cd "$root"
  # Debian 12 still ships a few libraries in /lib: merge them into usr/lib.
  if [[ -d lib ]]; then
    mkdir -p "$ARCH_LIB"
    cp -a lib/x86_64-linux-gnu/. "$ARCH_LIB/"
    rm -rf lib
  fi
  rm -rf usr/share/doc usr/share/man usr/share/info usr/share/lintian usr/share/bug usr/share/doc-base \
    usr/share/locale usr/share/java usr/share/gdb usr/src etc/gss
  # Open MPI: no Fortran, Java, OpenSHMEM, debugger or tracing parts.
  rm -rf "$ARCH_LIB/fortran" "$ARCH_LIB"/libmpi_mpifh* "$ARCH_LIB"/libmpi_usempi* "$ARCH_LIB"/libmpi_java.* \
    "$ARCH_LIB"/liboshmem.* "$ARCH_LIB"/libompitrace.* \
    "$ARCH_LIB"/openmpi/lib/libmpi_mpifh.so "$ARCH_LIB"/openmpi/lib/libmpi_usempi* \
    "$ARCH_LIB"/openmpi/lib/libmpi_java.so "$ARCH_LIB"/openmpi/lib/liboshmem.so \
    "$ARCH_LIB"/openmpi/lib/libompitrace.so "$ARCH_LIB"/openmpi/lib/ompi_monitoring_prof.so \
    "$ARCH_LIB"/openmpi/include/openshmem "$ARCH_LIB"/openmpi/include/mpif* \
    "$ARCH_LIB"/openmpi/include/shmem* "$ARCH_LIB"/openmpi/include/pshmem*
  (cd usr/bin && rm -f mpif77* mpif90* mpifort* mpijavac* osh* shmem* oshmem_info)
  # Components that need libraries this bundle does not carry (Debian disables most of
  # them in /etc/openmpi anyway), and OpenSHMEM's frameworks.
  local mca="$ARCH_LIB/openmpi/lib/openmpi3"
  rm -f "$mca"/mca_{mtl_ofi,btl_ofi,btl_openib,mtl_psm,mtl_psm2,pml_ucx,osc_ucx,reachable_netlink}.so \
    "$mca"/mca_{atomic,memheap,scoll,spml,sshmem}_*.so \
    "$ARCH_LIB"/libmca_common_{ofi,ucx,verbs}.* "$ARCH_LIB"/openmpi/lib/libmca_common_{ofi,ucx,verbs}.so
  # PMIx: runtime only.
  rm -rf "$ARCH_LIB"/pmix2/include "$ARCH_LIB"/pmix2/lib/libpmix.a "$ARCH_LIB"/pkgconfig/pmix.pc \
    "$ARCH_LIB"/libpmix.so "$ARCH_LIB"/pmix2/lib/libpmix.so
  # krb5 plugins (only for KDC back ends) and ICU's test/tool libraries.
  rm -rf "$ARCH_LIB"/krb5 "$ARCH_LIB"/libicutest.* "$ARCH_LIB"/libicutu.* \
    "$ARCH_LIB"/pkgconfig/icu-io.pc "$ARCH_LIB"/libicuio.*
  prune_boost
  # gRPC: the secure C++ library, its C core and grpc_cpp_plugin only (no insecure-only
  # builds, reflection, channelz or ALTS; no other languages' plugins).
  rm -f "$ARCH_LIB"/lib{grpc,grpc++}_unsecure.* "$ARCH_LIB"/pkgconfig/{grpc,grpc++}_unsecure.pc \
    "$ARCH_LIB"/libgrpc++_{alts,error_details,reflection}.* "$ARCH_LIB"/libgrpcpp_channelz.* \
    usr/bin/grpc_{php,python,ruby,csharp,node,objective_c}_plugin
  # Static libraries: only libprotobuf.a and GoogleTest's (its CMake config requires all).
  find . -name '*.a' ! -name libprotobuf.a ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
  find . -name '*.la' -delete
  relativize_symlinks
  # Dangling links (the -dev symlinks of pruned libraries), then empty folders.
  find . -xtype l -delete
  find . -depth -type d -empty -delete
  relocate_pkgconfig
  # The names Debian gives these through alternatives, which dpkg -x does not create.
  ln -sfn mpirun.openmpi usr/bin/mpirun
  ln -sfn mpiexec.openmpi usr/bin/mpiexec
  ln -sfn mpicxx.openmpi usr/bin/mpicxx
  ln -sfn mpicc.openmpi usr/bin/mpicc
  cd - > /dev/null
}

# Boost's headers are 160 MiB; the sources include a few of Asio's and Beast's. Kept: each
# Boost library (a folder under boost/, with its top-level .hpp) that the preprocessor
# reads for those includes (`c++ -M` against this tree, see boost_includes), and all of
# boost/config, where Boost picks its compiler and standard-library settings. Whole
# folders, not single files, so that a newer compiler taking another branch inside a
# library still finds its headers. Runs in the tree's root.
prune_boost() {
  local tu used name
  tu=$(mktemp --suffix=.cc)
  boost_includes > "$tu"
  used=$(c++ -std=c++17 -M -MT x -I "$PWD/usr/include" "$tu" | tr ' ' '\n' |
         sed -n "s|^$PWD/usr/include/boost/\([^/]*\).*|\1|p" | sed 's/\.hpp$//' | sort -u) ||
    { rm -f "$tu"; die "c++ -M of the sources' Boost includes failed"; }
  rm -f "$tu"
  used=" config $(tr '\n' ' ' <<< "$used")"
  for name in usr/include/boost/*; do
    name=${name##*/}
    [[ "$used" == *" ${name%.hpp} "* ]] || rm -rf "usr/include/boost/$name"
  done
}

# The Boost #include lines of the sources, each once (the translation unit prune_boost
# preprocesses; also part of the deps stamp, so a new include rebuilds the tarball).
boost_includes() {
  git -C "$REPO" grep -h -E '^#include <boost/' -- '*.cc' '*.h' | sort -u
}

# Absolute symlinks would point into the GPU machine's own /usr: make them relative.
relativize_symlinks() {
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    [[ "$target" == /* ]] || continue
    # /lib was merged into usr/lib above (zlib1g-dev's libz.so points into /lib).
    [[ "$target" == /lib/* ]] && target=/usr$target
    if [[ -e ".$target" || -L ".$target" ]]; then
      ln -sfn "$(realpath -s --relative-to="$(dirname "$link")" ".$target")" "$link"
    else
      rm -f "$link"
    fi
  done < <(find . -type l -print0)
}

# A variable set to /usr or below (prefix=/usr, and libcurl's
# includedir=/usr/include/x86_64-linux-gnu) becomes a path relative to the .pc file,
# which pkgconf and pkg-config both expand (${pcfiledir}).
relocate_pkgconfig() {
  local pc up
  while IFS= read -r -d '' pc; do
    up=$(realpath -s --relative-to="$(dirname "$pc")" usr)
    sed -i "s|^\([A-Za-z_]*\)=/usr\(/.*\)\?\$|\1=\${pcfiledir}/$up\2|" "$pc"
  done < <(find . -name '*.pc' -print0)
}

# Every kept ELF shared object and executable must find its libraries in the tree or in
# BASE_SONAMES; otherwise the list above or the pruning is wrong.
check_closure() {
  local root=$1 have f need unresolved=""
  have=" $( { echo "$BASE_SONAMES"; find "$root" \( -type f -o -type l \) -name 'lib*.so*' -printf '%f\n'; } |
           tr -s ' \n' '  ') "
  while IFS= read -r -d '' f; do
    head -c 4 "$f" | grep -q 'ELF' || continue
    for need in $(readelf -d "$f" 2> /dev/null | awk '/\(NEEDED\)/ { gsub(/[][]/, "", $5); print $5 }'); do
      [[ "$have" == *" $need "* ]] || unresolved+="  ${f#"$root"/} needs $need"$'\n'
    done
  done < <(find "$root" -type f \( -name '*.so*' -o -perm -u+x \) -print0)
  [[ -z "$unresolved" ]] || die "unresolved libraries in the bundle:"$'\n'"$unresolved"
}

build_deps_tarball() {
  local stamp=$1 stage="$CACHE/stage"
  log "unpacking $(wc -l <<< "$DEB_FILES") packages into $stage"
  rm -rf "$stage" && mkdir -p "$stage/root"
  local file
  for file in $DEB_FILES; do
    dpkg-deb -x "$CACHE/debs/$file" "$stage/root"
  done
  prune_tree "$stage/root"
  check_closure "$stage/root"
  log "pruned tree: $(du -sm "$stage/root" | cut -f1) MiB unpacked; compressing (xz -9)"
  mkdir -p "$BUNDLE"
  tar -C "$stage/root" --sort=name --owner=0 --group=0 --numeric-owner -cf - . |
    xz -9 -T2 > "$BUNDLE/deps.tar.xz.tmp"
  mv "$BUNDLE/deps.tar.xz.tmp" "$BUNDLE/deps.tar.xz"
  stamp_set deps "$stamp"
  stamp_set deps-unpacked-mib "$(du -sm "$stage/root" | cut -f1)"
}

ensure_prepared_data() {
  local prepared="$REPO/data/prepared" f
  for f in langid/train.tsv langid/dev.tsv langid/test.tsv langid/vocab.txt langid/labels.txt \
           topics/train.tsv topics/dev.tsv topics/test.tsv topics/vocab.txt topics/labels.txt; do
    if [[ ! -f "$prepared/$f" ]]; then
      [[ -x "$VENV/bin/python" ]] || die "data/prepared is missing and there is no $VENV/bin/python to make it"
      log "data/prepared is incomplete: running scripts/prepare_data.py"
      "$VENV/bin/python" "$REPO/scripts/prepare_data.py"
      return
    fi
  done
}

build_data_tarball() {
  ensure_prepared_data
  local stamp
  stamp=$(cd "$REPO" && find data/prepared -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [[ $FORCE -eq 0 && -f "$BUNDLE/data.tar.xz" && "$(stamp_get data)" == "$stamp" ]]; then
    log "data.tar.xz is up to date"
    return
  fi
  log "compressing data/prepared"
  mkdir -p "$BUNDLE"
  tar -C "$REPO" --sort=name --owner=0 --group=0 --numeric-owner -cf - data/prepared |
    xz -9 -T2 > "$BUNDLE/data.tar.xz.tmp"
  mv "$BUNDLE/data.tar.xz.tmp" "$BUNDLE/data.tar.xz"
  stamp_set data "$stamp"
}

fetch_wheels() {
  local name version want=() stamp platform_args=()
  [[ -x "$VENV/bin/python" ]] || die "no $VENV/bin/python, whose package versions the wheels follow: run scripts/setup.sh"
  for name in "${WHEELS[@]}"; do
    version=$("$VENV/bin/python" -m pip show "$name" 2> /dev/null | awk '/^Version:/ { print $2 }')
    [[ -n "$version" ]] || die "the venv has no $name: run scripts/setup.sh"
    want+=("$name==$version")
  done
  stamp=$(printf '%s\n' "$GPU_PYTHON" "${want[@]}" | sha256sum | cut -d' ' -f1)
  if [[ $FORCE -eq 0 && -d "$BUNDLE/wheels" && "$(stamp_get wheels)" == "$stamp" ]]; then
    log "wheels/ is up to date"
    return
  fi
  log "downloading ${#want[@]} wheels for Python $GPU_PYTHON: ${want[*]}"
  for name in "${WHEEL_PLATFORMS[@]}"; do platform_args+=(--platform "$name"); done
  rm -rf "$BUNDLE/wheels.tmp" && mkdir -p "$BUNDLE/wheels.tmp"
  "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" \
    --implementation cp "${platform_args[@]}" -d "$BUNDLE/wheels.tmp" "${want[@]}" ||
    die "pip could not download the wheels (PyPI unreachable, or a version without a Python $GPU_PYTHON wheel)"
  rm -rf "$BUNDLE/wheels" && mv "$BUNDLE/wheels.tmp" "$BUNDLE/wheels"
  stamp_set wheels "$stamp"
}

write_manifest() {
  {
    echo "# Trainyard GPU bundle: Debian 12 packages unpacked into deps.tar.xz (see scripts/gpu/bundle.sh)."
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), from commit $(git -C "$REPO" rev-parse --short=12 HEAD 2> /dev/null || echo unknown)"
    echo "deps.tar.xz: $(stat -c %s "$BUNDLE/deps.tar.xz") bytes, $(stamp_get deps-unpacked-mib) MiB unpacked, sha256 $(sha256sum "$BUNDLE/deps.tar.xz" | cut -d' ' -f1)"
    echo "data.tar.xz: $(stat -c %s "$BUNDLE/data.tar.xz") bytes, sha256 $(sha256sum "$BUNDLE/data.tar.xz" | cut -d' ' -f1)"
    echo "wheels (Python $GPU_PYTHON):"
    local wheel
    for wheel in "$BUNDLE"/wheels/*.whl; do echo "  $(basename "$wheel")"; done
    echo "packages:"
    local file
    for file in $DEB_FILES; do
      dpkg-deb -f "$CACHE/debs/$file" Package Version | paste -sd' ' | sed 's/^Package: /  /; s/ Version: / /'
    done
  } > "$BUNDLE/MANIFEST.txt"
}

# Bytes of what the GPU tool carries: the working tree's tracked and untracked,
# not-ignored files, plus .gpu-bundle.
report_size() {
  local tree_bytes bundle_bytes total budget
  tree_bytes=$(cd "$REPO" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2> /dev/null |
               awk '{ s += $1 } END { print s + 0 }')
  bundle_bytes=$(find "$BUNDLE" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
  total=$((tree_bytes + bundle_bytes))
  budget=$((BUDGET_MIB * 1024 * 1024))
  log "sizes: .gpu-bundle $(mib "$bundle_bytes") MiB (deps.tar.xz $(mib "$(stat -c %s "$BUNDLE/deps.tar.xz")"), data.tar.xz $(mib "$(stat -c %s "$BUNDLE/data.tar.xz")")) + working tree $(mib "$tree_bytes") MiB = $(mib "$total") MiB carried, budget $BUDGET_MIB MiB"
  if [[ $total -gt $budget ]]; then
    echo "[bundle] error: OVER BUDGET: $(mib "$total") MiB carried > $BUDGET_MIB MiB" >&2
    exit 1
  fi
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

main() {
  check_host
  mkdir -p "$CACHE"
  fetch_debs
  local stamp
  stamp=$( { echo "$DEB_LIST"; sha256sum < "$SELF"; boost_includes; } | sha256sum | cut -d' ' -f1)
  if [[ $FORCE -eq 0 && -f "$BUNDLE/deps.tar.xz" && "$(stamp_get deps)" == "$stamp" ]]; then
    log "deps.tar.xz is up to date"
  else
    build_deps_tarball "$stamp"
  fi
  build_data_tarball
  fetch_wheels
  write_manifest
  report_size
  log "done: carry .gpu-bundle and run scripts/gpu/build_and_test.sh on the GPU machine"
}

main
