"""The benchmark record: what a run measured and where (meta), kept as JSON and rendered
into benchmarks/results/latest.md and a marked block of docs/performance.md.

The Markdown is always rendered from the JSON (`python -m benchmarks --render FILE`),
so the docs table is the one the committed record holds
(tests/benchmarking/test_benchmark_record.py).
"""

import json
import os
import platform
import re
import subprocess
import sys
import time

from ._util import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
LATEST_JSON = os.path.join(RESULTS, "latest.json")
LATEST_MD = os.path.join(RESULTS, "latest.md")
DOCS = os.path.join(ROOT, "docs", "performance.md")
BEGIN = ("<!-- benchmarks:begin: generated from benchmarks/results/latest.json by "
         "`python -m benchmarks`; do not edit by hand -->")
END = "<!-- benchmarks:end -->"
_BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def git_commit():
    """The checkout's commit (short hash), with "+dirty" if tracked files differ from it;
    "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, timeout=30,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, timeout=30, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def start_meta(names, quick):
    """What is known before the run: commit, date, machine, load average, settings."""
    import numpy
    return {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": os.getloadavg()[0],
            "python": platform.python_version(), "numpy": numpy.__version__,
            "quick": quick, "benchmarks": list(names), "started": time.monotonic()}


def finish_meta(meta):
    """Add the load at the end and the run's duration."""
    meta = dict(meta)
    meta["load_end"] = os.getloadavg()[0]
    meta["seconds"] = time.monotonic() - meta.pop("started")
    return meta


def load(path):
    """(results, meta) of a record written by `save`."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        raise SystemExit("cannot read the benchmark record %s: %s" % (path, exc)) from None
    try:
        return record["results"], record["meta"]
    except (KeyError, TypeError):
        raise SystemExit("%s is not a benchmark record (no 'results' and 'meta'): write one "
                         "with python -m benchmarks" % path) from None


def save(path, results, meta):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
        f.write("\n")


def docs_block(text=None):
    """The generated block of docs/performance.md (from `text`, default the file)."""
    if text is None:
        with open(DOCS) as f:
            text = f.read()
    found = _BLOCK.search(text)
    if found is None:
        raise SystemExit("%s has no block between\n%s\nand\n%s\n: put those two lines where the "
                         "benchmark table goes" % (DOCS, BEGIN, END))
    return found.group(1)


def write_docs(markdown, path=DOCS):
    """Replace the generated block of docs/performance.md with `markdown`."""
    with open(path) as f:
        text = f.read()
    docs_block(text)  # raises if the markers are missing
    new = _BLOCK.sub(lambda m: BEGIN + "\n" + markdown + END, text, count=1)
    if new != text:
        with open(path, "w") as f:
            f.write(new)


GENERATED_MD = ("<!-- generated from benchmarks/results/latest.json by `python -m benchmarks "
                "--write-docs`; do not edit -->\n\n")


def write_markdown(markdown, path=LATEST_MD):
    """benchmarks/results/latest.md: `markdown` under a line saying it is generated."""
    with open(path, "w") as f:
        f.write(GENERATED_MD + markdown)


def log(text):
    print("..", text, file=sys.stderr, flush=True)
