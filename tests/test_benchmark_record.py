"""The committed benchmark record: it renders, and latest.md and docs/performance.md hold
exactly what it renders (so the published table cannot drift from the measurements)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import record  # noqa: E402  (no side effects, unlike benchmarks.run)

RESULTS = os.path.join(ROOT, "benchmarks", "results")
LATEST = os.path.join(RESULTS, "latest.json")


def render(path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--render", path], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def rendered():
    return render(LATEST)


def test_the_record_is_a_full_run_with_its_circumstances():
    with open(LATEST) as f:
        record = json.load(f)
    meta = record["meta"]
    for key in ("commit", "date", "cpu", "cores", "load_start", "load_end", "seconds"):
        assert key in meta, "latest.json lacks meta %r: regenerate it with python -m benchmarks" \
            % key
    assert not meta["quick"], "latest.json comes from --quick: regenerate it with a full run"
    assert set(record["results"]) >= {"control_tcp", "control_ipc", "idle", "scaling",
                                      "accuracy", "contention_one"}


def test_the_record_covers_every_benchmark_of_the_suite(rendered):
    # the footer names --quick or --only when the record lacks some of benchmarks.run.NAMES
    assert "\n`python -m benchmarks` at commit " in rendered, (
        "latest.json is not a full run of today's suite (a benchmark was added since?): "
        "regenerate it with python -m benchmarks")


def test_latest_md_is_what_the_record_renders(rendered):
    with open(os.path.join(RESULTS, "latest.md")) as f:
        assert f.read() == record.GENERATED_MD + rendered, \
            "run python -m benchmarks --write-docs"


def test_the_docs_table_is_what_the_record_renders(rendered):
    assert record.docs_block() == rendered, "run python -m benchmarks --write-docs"


def test_every_target_says_whether_it_is_met(rendered):
    rows = [line.split(" | ") for line in rendered.splitlines()
            if line.startswith("| ") and line.count(" | ") == 5]
    targets = {row[0][2:]: row[5].rstrip(" |") for row in rows[1:] if row[4].strip()}
    assert "scaling: 2 workers vs that ceiling" in targets
    assert any(name.startswith("control round trip") for name in targets)
    assert any(name.startswith("minibatches") for name in targets)
    for name, met in targets.items():
        assert met in ("yes", "**no**"), (name, met)
    with open(LATEST) as f:
        assert "commit %s," % json.load(f)["meta"]["commit"] in rendered


def test_write_docs_replaces_only_the_marked_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nbefore\n\n%s\nold table\n%s\n\nafter\n" % (record.BEGIN,
                                                                       record.END))
    record.write_docs("| new | table |\n", str(page))
    assert page.read_text() == "# Title\n\nbefore\n\n%s\n| new | table |\n%s\n\nafter\n" % (
        record.BEGIN, record.END)
    page.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="benchmarks:begin"):
        record.write_docs("x\n", str(page))
