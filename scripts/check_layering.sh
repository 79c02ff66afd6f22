#!/usr/bin/env bash
# Checks that every C++ file includes only what its folder's layer may use, so the
# layering of the tree (docs/architecture.md) cannot erode:
#   - project includes ("folder/file.h") follow the allow-list below: a folder uses
#     itself and the layers beneath it (coordinator/, common/ and data/ never include
#     worker/; worker/models/ never includes worker/jobs/; ...);
#   - libtorch (<torch/...>, <ATen/...>, <c10/...>) only in the torch folders of worker/;
#   - protobuf and gRPC only in proto/, coordinator/, worker/pool/, worker/serve/ and their tests,
#     and in the TensorBoard event writer (worker/report/event_file.cc)
#     (libtorch and Debian's libsentencepiece carry protobuf runtimes of their own); ZeroMQ
#     there too, and in worker/jobs/ (the serve job's model process speaks the serving link,
#     which carries no protobuf) and common/curve/ (CURVE keys);
#   - spdlog and {fmt} never in a torch folder (libtorch bundles another {fmt});
#   - no <regex> outside tests: libstdc++'s matcher backtracks and recurses per input
#     byte, so text from a user or a client could hang or crash it (RE2 instead).
# Tests may use any layer; torch-free test folders follow the torch rule too.
#   scripts/check_layering.sh [--root DIR]     exit 0 clean, 1 with one line per violation
#   scripts/check_layering.sh --self-test      plants bad includes in a copy; expects each caught
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
usage() { sed -n '2,18p' "$0"; }

# folder (longest prefix wins) -> the project folders its files may include
declare -A MAY_USE=(
  [common/]="common/"
  [common/spec/]="common/"
  [common/curve/]="common/"
  [proto/]="proto/ common/"
  [data/]="data/ common/"
  [coordinator/]="coordinator/ proto/ common/"
  [worker/report/]="worker/report/ common/"
  [worker/pool/]="worker/pool/ worker/elastic/ worker/report/ proto/ common/"
  [worker/serve/]="worker/serve/ data/ common/"
  [worker/kernels/]="worker/kernels/ common/"
  [worker/models/]="worker/models/ worker/kernels/ common/"
  [worker/compiled/]="worker/compiled/ common/"
  [worker/generation/]="worker/generation/ worker/models/ worker/kernels/ worker/compiled/ common/"
  [worker/comm/]="worker/comm/ common/"
  [worker/elastic/]="worker/elastic/ common/"
  [worker/train/]="worker/train/ worker/models/ worker/kernels/ data/ common/"
  [worker/jobs/]="worker/jobs/ worker/elastic/ worker/train/ worker/comm/ worker/generation/ worker/compiled/ worker/models/ worker/kernels/ worker/report/ data/ common/"
  [worker/runtime/]="worker/runtime/ worker/jobs/ worker/elastic/ worker/pool/ worker/train/ worker/comm/ worker/generation/ worker/compiled/ worker/models/ worker/kernels/ worker/report/ data/ common/"
  [tests/]="common/ proto/ data/ coordinator/ worker/ tests/"
)
TORCH_FOLDERS="worker/kernels/ worker/models/ worker/compiled/ worker/generation/ worker/comm/ worker/train/ worker/jobs/ worker/runtime/ tests/worker/ tests/gpu/ tests/tools/"
WIRE_FOLDERS="proto/ coordinator/ worker/pool/ worker/serve/ worker/report/event_file.cc tests/coordinator/ tests/fuzz/ tests/worker/pool/ tests/worker/serve/"
ZMQ_FOLDERS="$WIRE_FOLDERS common/curve/ worker/jobs/"

folder_of() {  # the MAY_USE key that is the longest prefix of $1
  local file=$1 best="" key
  for key in "${!MAY_USE[@]}"; do
    [[ $file == "$key"* && ${#key} -gt ${#best} ]] && best=$key
  done
  echo "$best"
}

in_any() {  # in_any FILE "prefix prefix..."
  local prefix
  for prefix in $2; do [[ $1 == "$prefix"* ]] && return 0; done
  return 1
}

check_file() {  # prints one line per violation in $1 (relative to the root)
  local file=$1 folder line target n=0
  folder=$(folder_of "$file")
  [[ -n $folder ]] || return 0
  while IFS= read -r line; do
    n=$((n + 1))
    [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*([\"\<])([^\"\>]+) ]] || continue
    target=${BASH_REMATCH[2]}
    if [[ ${BASH_REMATCH[1]} == '"' && $target == */* ]] && ! in_any "$target" "${MAY_USE[$folder]}"; then
      echo "$file:$n: includes $target, but $folder may only use: ${MAY_USE[$folder]}"
    fi
    if [[ $target =~ ^(torch|ATen|c10|caffe2)/ ]] && ! in_any "$file" "$TORCH_FOLDERS"; then
      echo "$file:$n: includes libtorch ($target) outside the torch folders: $TORCH_FOLDERS"
    fi
    if [[ $target =~ ^(google/protobuf/|grpcpp/|[a-z_]+\.pb\.h|[a-z_]+\.grpc\.pb\.h) ]] && ! in_any "$file" "$WIRE_FOLDERS"; then
      echo "$file:$n: includes the wire ($target) outside $WIRE_FOLDERS"
    fi
    if [[ $target =~ ^zmq ]] && ! in_any "$file" "$ZMQ_FOLDERS"; then
      echo "$file:$n: includes ZeroMQ ($target) outside $ZMQ_FOLDERS"
    fi
    if [[ $target =~ ^(spdlog|fmt)/ ]] && in_any "$file" "$TORCH_FOLDERS"; then
      echo "$file:$n: includes $target in a torch folder (libtorch bundles its own {fmt}); use common/log.h"
    fi
    if [[ $target == regex ]] && [[ $file != tests/* ]]; then
      echo "$file:$n: includes <regex>, whose matcher recurses per input byte; use RE2 (common/module_pattern.h)"
    fi
  done < "$ROOT/$file"
}

source_files() {  # the C++ files beneath the root, relative to it
  local folder folders=()
  for folder in common proto data coordinator worker tests; do [[ -d $ROOT/$folder ]] && folders+=("$folder"); done
  (cd "$ROOT" && find "${folders[@]}" -type f \( -name '*.h' -o -name '*.cc' \) | sort)
}

check_tree() {
  local file
  while IFS= read -r file; do
    check_file "$file"
  done < <(source_files)
}

# Each plant goes into a copy of its file alone, in a folder of its own: the rules depend
# only on a file's path beneath the root, and the checker must name that file's line.
self_test() {
  local copy failures=0 plant file report
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' RETURN
  for plant in 'coordinator/server.cc|#include "worker/jobs/trainer.h"' \
               'data/text_dataset.cc|#include <torch/torch.h>' \
               'common/csv.cc|#include "trainyard.pb.h"' \
               'worker/models/bert.cc|#include "worker/jobs/trainer.h"' \
               'worker/train/optimizer.cc|#include <spdlog/spdlog.h>' \
               'worker/serve/kserve_http.cc|#include <regex>'; do
    file=${plant%%|*}
    rm -rf "${copy:?}"/*
    mkdir -p "$copy/$(dirname "$file")"
    cp "$ROOT/$file" "$copy/$file"
    if ! "$0" --root "$copy" > /dev/null 2>&1; then
      echo "self-test: $file alone is not clean"
      failures=$((failures + 1))
      continue
    fi
    echo "${plant#*|}" >> "$copy/$file"
    report=$("$0" --root "$copy" 2> /dev/null || true)
    if [[ $report == "$file:$(wc -l < "$copy/$file"): "* ]]; then
      echo "self-test: caught '${plant#*|}' planted in $file"
    else
      echo "self-test: a planted '${plant#*|}' in $file was NOT caught (got: ${report:-nothing})"
      failures=$((failures + 1))
    fi
  done
  return $failures
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --self-test) self_test; exit $? ;;
  --root) ROOT=$(cd "$2" && pwd) ;;
  "") ;;
  *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
report=$(check_tree)
if [[ -n $report ]]; then
  echo "$report"
  echo "layering: $(echo "$report" | wc -l) violation(s)" >&2
  exit 1
fi
echo "layering: clean ($(source_files | wc -l) files)"
