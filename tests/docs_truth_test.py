#!/usr/bin/env python3
"""The docs say what the code has. Fails naming each thing the docs (README.md and docs/)
do not mention, in backticks:
  - every job-file key, read from the schema in common/spec/job_spec.cc and
    search_spec.cc (the key lists that CheckKeys and Section refuse unknown keys against);
  - every job kind (the names job_spec.cc maps to JobKind);
  - every flag in the --help of worker, coordinator and jobctl (and jobctl's subcommands);
  - every fuzz target (tests/fuzz/fuzz_*.cc) and every ctest label (tests/CMakeLists.txt);
and every link between the pages whose file or #anchor does not exist."""
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SOURCE_DIR as ROOT, check, run_test  # noqa: E402


def docs():
    """{path relative to ROOT: text} of README.md and docs/*.md."""
    paths = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return {p: open(os.path.join(ROOT, p), encoding="utf-8").read() for p in paths}


def code_spans(texts):
    """Every `code span` of the docs, and every fenced code block, as one string each."""
    spans = []
    for text in texts.values():
        spans += re.findall(r"```.*?```", text, flags=re.S)
        spans += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return spans


def mentioned(word, spans):
    pattern = re.compile(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])")
    return any(pattern.search(span) for span in spans)


def schema_keys():
    """The keys of job files and of search files (common/spec/search_spec.cc)."""
    source = "".join(open(os.path.join(ROOT, "common", "spec", name), encoding="utf-8").read()
                     for name in ("job_spec.cc", "search_spec.cc"))
    keys = set()
    for call in re.finditer(r"(?:CheckKeys|Section)\([^{;]*\{([^}]*)\}", source):
        keys |= set(re.findall(r'"([a-z_0-9]+)"', call.group(1)))
    return keys


def job_kinds():
    source = open(os.path.join(ROOT, "common", "spec", "job_spec.cc"), encoding="utf-8").read()
    return set(re.findall(r'\{"([a-z_]+)",\s*JobKind::', source))


def flags(binary, *argv):
    out = subprocess.run([binary, *argv, "--help"], capture_output=True, text=True, timeout=60).stdout
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", out)) - {"--help"}


def jobctl_subcommands(jobctl):
    out = subprocess.run([jobctl, "--help"], capture_output=True, text=True, timeout=60).stdout
    return re.findall(r"^  ([a-z]+)\s{2,}", out.split("Subcommands:")[-1], flags=re.M)


def ctest_labels():
    text = open(os.path.join(ROOT, "tests", "CMakeLists.txt"), encoding="utf-8").read()
    labels = set()
    for block in re.findall(r"LABELS\s+([^)\n]*)", text):
        for word in block.split():
            if word.isupper() or word.startswith("$") or word.startswith('"$'):
                break
            labels.add(word.strip('"'))
    return {label for label in labels if re.fullmatch(r"[a-z]+", label)}


def slug(heading):
    """The anchor Python-Markdown (mkdocs) and GitHub give a heading, for plain headings."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def broken_links(texts):
    anchors = {}
    for path, text in texts.items():
        body = re.sub(r"```.*?```", "", text, flags=re.S)
        anchors[path] = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", body, flags=re.M)}
    broken = []
    for path, text in texts.items():
        body = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", body):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(os.path.join(ROOT, resolved)):
                broken.append(f"{path}: link to {target}: no file {resolved}")
            elif anchor and resolved in anchors and anchor not in anchors[resolved]:
                broken.append(f"{path}: link to {target}: no heading #{anchor} in {resolved}")
    return broken


def test(args, work):
    texts = docs()
    spans = code_spans(texts)
    missing = []
    for what, words in [("job-file key", schema_keys()), ("job kind", job_kinds()),
                        ("fuzz target", {os.path.basename(p)[:-3] for p in
                                         glob.glob(os.path.join(ROOT, "tests", "fuzz", "fuzz_*.cc"))}),
                        ("ctest label", ctest_labels())]:
        missing += [f"{what} {w}" for w in sorted(words) if not mentioned(w, spans)]
    commands = [("worker", [args.worker]), ("coordinator", [args.coordinator]), ("jobctl", [args.jobctl])]
    commands += [(f"jobctl {sub}", [args.jobctl, sub]) for sub in jobctl_subcommands(args.jobctl)]
    for name, argv in commands:
        missing += [f"{name} flag {f}" for f in sorted(flags(*argv)) if not mentioned(f, spans)]
    missing += broken_links(texts)
    counts = (len(schema_keys()), len(job_kinds()), len(commands))
    for line in missing:
        print("missing:", line)
    print(f"{counts[0]} job-file keys, {counts[1]} job kinds, the --help of {counts[2]} commands, fuzz targets, "
          f"ctest labels and links between {len(texts)} pages: {len(missing)} missing")
    check(not missing, f"{len(missing)} things the docs do not mention (the missing: lines above)")


if __name__ == "__main__":
    run_test(test, ("--worker", "--coordinator", "--jobctl"), __doc__)
