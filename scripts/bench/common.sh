# Sourced by the benchmark scripts, from the repository root: sets PY (TRAINYARD_PYTHON,
# else the venv's python) and WORKER (the worker binary under TRAINYARD_BIN, default
# build/bin, built if it is missing there), prepares the data, and makes WORK, a
# scratch folder removed on exit unless KEEP_WORK is set.
PY="${TRAINYARD_PYTHON:-${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python}"
BIN="${TRAINYARD_BIN:-build/bin}"
WORKER="$BIN/worker"
[[ -x $WORKER ]] || { [[ -z ${TRAINYARD_BIN:-} ]] && scripts/build.sh worker; } ||
  { echo "error: no worker binary at $WORKER" >&2; exit 2; }
"$PY" scripts/prepare_data.py > /dev/null
WORK=$(mktemp -d)
[[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$WORK"' EXIT

# make_long_tsv SRC DST COUNT: COUNT labelled rows of SRC, each text joined with the
# following ones to 2,000+ characters, so that a batch cut at any seq <= 512 tokens is
# exactly batch x seq tokens and both sides of a benchmark do identical work.
make_long_tsv() {
  "$PY" - "$1" "$2" "$3" <<'PY'
import sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [l.rstrip("\n").split("\t", 1) for l in open(src, encoding="utf-8").readlines()[1:]]
out, i = [], 0
while len(out) < count:
    label, text = rows[i % len(rows)]
    while len(text) < 2000:
        i += 1
        text += " " + rows[i % len(rows)][1]
    out.append(f"{label}\t{text}\n")
    i += 1
open(dst, "w", encoding="utf-8").write("label\ttext\n" + "".join(out))
PY
}
