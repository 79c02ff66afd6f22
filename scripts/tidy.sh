#!/usr/bin/env bash
# Runs clang-tidy with the checks in .clang-tidy (bugprone-*, a few performance-*) on
# the C++ files changed since a base commit, or on the files given. Exit 1 on findings.
#   scripts/tidy.sh                 files changed since HEAD~1 (what the last commit touched)
#   scripts/tidy.sh --base REV      files changed since REV
#   scripts/tidy.sh FILE.cc...      these files
#   --torch-free                    only files outside the torch folders (seconds each; CI)
# Uses build/compile_commands.json (scripts/build.sh makes it), without the GCC
# precompiled headers, which clang cannot read: files that include libtorch take tens
# of seconds each.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${TRAINYARD_BUILD_DIR:-build}"
BASE=HEAD~1
FILES=()
TORCH_FREE=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --torch-free) TORCH_FREE=true; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) FILES+=("$1"); shift ;;
  esac
done
if [[ ${#FILES[@]} -eq 0 ]]; then
  mapfile -t FILES < <(git diff --name-only --diff-filter=ACMR "$BASE" -- '*.cc' | grep -v '^tests/' || true)
fi
if [[ $TORCH_FREE == true && ${#FILES[@]} -gt 0 ]]; then
  mapfile -t FILES < <(printf '%s\n' "${FILES[@]}" | grep -Ev '^worker/(kernels|models|compiled|generation|comm|train|jobs|runtime)/' || true)
fi
if [[ ${#FILES[@]} -eq 0 ]]; then
  echo "tidy: no changed C++ files since $BASE"
  exit 0
fi
[[ -f $BUILD/compile_commands.json ]] || { echo "error: no $BUILD/compile_commands.json; run scripts/build.sh" >&2; exit 2; }
mkdir -p "$BUILD/tidy"
python3 - "$BUILD/compile_commands.json" "$BUILD/tidy/compile_commands.json" <<'PY'
import json, re, sys
commands = json.load(open(sys.argv[1]))
for c in commands:
    c["command"] = re.sub(r"-include \S*cmake_pch\.hxx|-Winvalid-pch", "", c["command"])
json.dump(commands, open(sys.argv[2], "w"))
PY
echo "tidy: ${#FILES[@]} file(s): ${FILES[*]}"
# -Wcomma (reported as clang-diagnostic-comma): statements are not chained with the comma
# operator, which reads as one statement and is not one under an unbraced if.
printf '%s\n' "${FILES[@]}" | xargs -P "${TRAINYARD_BUILD_JOBS:-2}" -n 1 clang-tidy -p "$BUILD/tidy" --quiet \
  --extra-arg=-Wcomma --header-filter="^$PWD/(common|data|coordinator|proto|worker)/"
echo "tidy: clean"
