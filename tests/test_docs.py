"""The README and docs/: every link resolves, every Python block parses and its imports work."""

import ast
import glob
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def read(path):
    with open(path) as f:
        return f.read()


def anchors(path):
    """GitHub's anchors for the headings of a markdown file."""
    text = FENCE.sub("", read(path))
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def name(path):
    return os.path.relpath(path, ROOT)


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_link_resolves(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", read(page))):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            broken.append("%s: no file %s" % (target, name(full)))
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append("%s: no heading #%s in %s" % (target, anchor, name(full)))
    assert not broken, broken


def python_blocks():
    for page in PAGES:
        for number, (lang, code) in enumerate(FENCE.findall(read(page))):
            if lang == "python":
                yield pytest.param(code, id="%s-block%d" % (name(page), number))


@pytest.mark.parametrize("code", list(python_blocks()))
def test_every_python_block_parses_and_its_imports_resolve(code):
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module("%s.%s" % (node.module, alias.name))


def test_the_readme_front_page_stays_short():
    assert read(PAGES[0]).count("\n") <= 130


@pytest.mark.parametrize("page", PAGES + sorted(glob.glob(os.path.join(ROOT, "examples", "*",
                                                                      "*.py"))), ids=name)
def test_data_is_split_by_the_jobs_rank_and_size_not_one_nodes(page):
    """`num_replicas=w.num_workers, rank=w.worker_id` (or shard by them) counts one node's
    workers: on several nodes each node's workers would read the same data."""
    wrong = re.findall(r"num_replicas=\w+\.num_workers|rank=\w+\.worker_id|"
                       r"shard\([^)]*\bworker_id\b", read(page))
    assert not wrong, wrong
