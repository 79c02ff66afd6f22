#!/usr/bin/env bash
# Formats every C++ file of the project with clang-format (.clang-format: Google style,
# 120 columns), or with --check reports the files it would change and exits 1 (CI).
#   scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t FILES < <(git ls-files '*.cc' '*.h' '*.cu')
case "${1:-}" in
  --check)
    bad=()
    for f in "${FILES[@]}"; do
      clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || bad+=("$f")
    done
    if [[ ${#bad[@]} -gt 0 ]]; then
      printf 'not formatted (run scripts/format.sh): %s\n' "${bad[@]}"
      exit 1
    fi
    echo "format: ${#FILES[@]} files clean" ;;
  "") clang-format -i "${FILES[@]}" && echo "format: ${#FILES[@]} files formatted" ;;
  -h|--help) sed -n '2,4p' "$0" ;;
  *) echo "error: unknown argument '$1'" >&2; exit 2 ;;
esac
