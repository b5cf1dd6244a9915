"""The README and docs/: every link resolves, every Python block parses and its imports work."""

import ast
import glob
import importlib
import os
import re

import pytest

from helpers import ROOT

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) \
    + [os.path.join(ROOT, "CHANGELOG.md")]
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


# Every backticked repository path and command-line flag in the docs names something that exists.

REFERENCE_PAGES = PAGES + [os.path.join(ROOT, "tests", "README.md")] + sorted(
    glob.glob(os.path.join(ROOT, "benchmarks", "README*.md")))
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FILE_SUFFIX = re.compile(r"\.(py|md|sh|json|toml|cfg|c)$")
PATH_TOKEN = re.compile(r"^[\w*-][\w.*-]*(/[\w.*-]+)*/?$")
# Words the docs write in capitals for a name the reader chooses (`NAME_worker.py`).
PLACEHOLDERS = {"EXPERIMENT", "NAME", "SCRIPT", "CTL", "LOG_DIR", "DIR", "FILE", "JOBID"}
# Backticked paths that are deliberately not in the repository, each with why.
NOT_IN_THE_REPO = {
    "status.json": "the controller writes it into each job's log directory",
    "my_worker.py": "a user's script in an example command line",
    "train.py": "a user's script in an example command line",
    "trainer_state.json": "the Hugging Face Trainer writes it into each checkpoint",
    "platoon_state.json": "accelerate_auto writes it into each save_state's directory",
    "benchmarks/results/language_model_quick.*": "written by `--quick` runs, not kept",
    "benchmarks/results/time_to_accuracy_quick.*": "written by `--quick` runs, not kept",
}
# Backticked flags that belong to another program, each with whose.
OTHER_PROGRAMS_FLAGS = {
    "--use-pep517": "pip's",
    "--no-compile": "pip's",
    "--overlap": "examples/lstm/lstm_worker.py's own option (a user script's)",
}
# examples/upstream: the frameworks' example scripts' own options (transformers' run_clm.py
# run_mlm.py and their TrainingArguments, accelerate's local_sgd.py and checkpointing.py,
# Lightning's transformer.py).
OTHER_PROGRAMS_FLAGS.update((flag, "an examples/upstream script's own option") for flag in (
    "--mixed_precision",
    "--gradient_accumulation_steps",
    "--local_sgd_steps",
    "--cpu",
    "--tokenizer_name",
    "--model_type",
    "--config_overrides",
    "--block_size",
    "--train_file",
    "--validation_file",
    "--do_train",
    "--do_eval",
    "--bf16",
    "--use_cpu",
    "--report_to",
    "--max_steps",
    "--resume_from_checkpoint",
    "--output_dir",
    "--save_steps",
    "--line_by_line",
    "--max_seq_length",
    "--mlm_probability",
    "--checkpointing_steps",
    "--accumulate_grad_batches",
    "--precision",
    "--ckpt_path",
))
# Where the docs write `python -m MODULE` or a console script: the module whose main() builds
# the parser (benchmarks.X means benchmarks/X.py or benchmarks/X/__main__.py).
COMMANDS = {"platoon-launcher": "platoon.launch.cli:parse_args",
            "platoon.mpi": "platoon.mpi.runner", "benchmarks": "benchmarks.run",
            "platoon.elastic.node": "platoon.elastic.node",
            "platoon.elastic.lighthouse": "platoon.elastic.lighthouse"}


def spans(page):
    """The page's inline code spans, and the lines of its shell blocks."""
    text = read(page)
    found = SPAN.findall(FENCE.sub("", text))
    for lang, code in FENCE.findall(text):
        if lang in ("bash", "sh", "shell", "console"):
            found += [line.split(" #")[0] for line in code.splitlines()]
    return found


def defines(path, names):
    """Whether the Python file at `path` defines each of `names` (a function, a class, a name)."""
    source = read(path)
    return all(re.search(r"^\s*(def|class)\s+%s\b|^\s*%s\s*[:=]" % (n, n), source, re.M)
               for n in names)


def resolves(token, folders):
    """Whether the path `token` (`a/b.py`, `a/b.py::name`, `a/b.Class.method`, a launcher
    EXPERIMENT prefix, a glob) names something in one of `folders`; the folder it is in, or None."""
    path, _, test = token.partition("::")
    for folder in folders:
        full = os.path.normpath(os.path.join(folder, path))
        if "*" in path and glob.glob(full):
            return os.path.dirname(full)
        if os.path.isdir(full):
            return full
        if os.path.isfile(full):
            return os.path.dirname(full) if not test or defines(full, [test.split("[")[0]]) \
                else None
        if os.path.isfile(full + "_worker.py"):  # the launcher's EXPERIMENT prefix
            return os.path.dirname(full)
        module, _, names = full.partition(".")  # `_centre/shmem.remove_stale_segments`
        if names and "/" not in names and os.path.isfile(module + ".py") and not FILE_SUFFIX.search(
                full) and defines(module + ".py", names.split(".")):
            return os.path.dirname(module)
    return None


def known_folders():
    """The top-level folders and their sub-folders: a backticked `word/...` starting with one of
    these is a repository path (and `g/N` maths is not)."""
    tops = ["platoon", "docs", "tests", "benchmarks", "examples"]
    return set(tops) | {d for top in tops for d in os.listdir(os.path.join(ROOT, top))
                        if os.path.isdir(os.path.join(ROOT, top, d))}


def stale_paths(page):
    tokens = [t.strip(",;:()'\"") for span in spans(page) for t in span.split()]
    folders, stale, bare = [ROOT, os.path.dirname(page), os.path.join(ROOT, "platoon")], [], []
    tops = known_folders()
    for token in tokens:
        path = token.split("::")[0]
        if (not PATH_TOKEN.match(path) or token in NOT_IN_THE_REPO
                or set(re.split(r"[/_.]", path)) & PLACEHOLDERS):
            continue
        if "/" in path and path.split("/")[0] in tops:
            found = resolves(token, folders)
            if found is None:
                stale.append(token)
            elif found not in folders:
                folders.append(found)  # a bare `name.py` on this page may live there
        elif FILE_SUFFIX.search(path):
            bare.append(token)
    return stale + [token for token in bare if resolves(token, folders) is None]


@pytest.mark.parametrize("page", REFERENCE_PAGES, ids=name)
def test_every_backticked_path_exists(page):
    """A path is looked for from the repository root, the page's folder, platoon/, and the
    folders of the other paths the page names (`_controller/registry.py`, `peers.py`)."""
    stale = stale_paths(page)
    assert not stale, "%s names paths that are not in the repository: %s (fix the page, or add " \
        "the path to NOT_IN_THE_REPO with why)" % (name(page), stale)


class _Built(Exception):
    pass


def options_of(target):
    """The option strings that the parser built by `target` ("module" whose main() parses, or
    "module:function") accepts, shown in --help or not (old spellings): the parser is built
    in-process and stopped before it parses anything."""
    import argparse
    from unittest import mock

    module, _, function = target.partition(":")
    try:
        entry = getattr(importlib.import_module(module), function or "main")
    except AttributeError:
        entry = importlib.import_module(module + ".__main__").main
    seen = []
    real_add = argparse.ArgumentParser.add_argument

    def add_argument(parser, *names, **kwargs):
        seen.extend(n for n in names if n.startswith("-"))
        return real_add(parser, *names, **kwargs)

    def parse_known_args(parser, *args, **kwargs):
        raise _Built()

    with mock.patch.object(argparse.ArgumentParser, "add_argument", add_argument), \
            mock.patch.object(argparse.ArgumentParser, "parse_known_args", parse_known_args):
        try:
            entry()  # a parser's own factory returns it; a main() is stopped before it parses
        except _Built:
            pass
    assert seen, "%s built no parser" % target
    return set(seen) | {"-h", "--help"}


def flag_uses(page):
    """(command, flags) for each span that is a command line of ours, or (None, flags) for a
    span of bare long options (`--curve`, `--tie-beta B`)."""
    for span in spans(page):
        words = re.sub(r"'[^']*'|\"[^\"]*\"", "''", span).split()
        if not words:
            continue
        command, start = None, None
        if words[0].endswith("platoon-launcher"):
            command, start = "platoon-launcher", 1
        elif "-m" in words[:-1]:
            module = words[words.index("-m") + 1]
            if module in COMMANDS or module.split(".")[0] == "benchmarks":
                command, start = module, words.index("-m") + 2
        elif words[0].startswith("--") and words[0] != "--":
            start = 0
        if start is None:
            continue
        rest = words[start:]
        rest = rest[:rest.index("--")] if "--" in rest else rest
        flags = [w.split("=")[0] for w in rest if re.match(r"^--?[A-Za-z][\w*-]*(=|$)", w)]
        if command is None:
            flags = [f for f in flags if f.startswith("--")]
        yield command, flags


def test_every_backticked_flag_is_an_option_of_its_program():
    parsers = {}

    def options(command):
        target = COMMANDS.get(command, command)
        if target not in parsers:
            parsers[target] = options_of(target)
        return parsers[target]

    every = set().union(*(options(c) for c in [
        "platoon-launcher", "platoon.mpi", "platoon.elastic.node", "platoon.elastic.lighthouse",
        "benchmarks", "platoon.compat.controller_args:"
        "default_parser"] + ["benchmarks." + os.path.basename(p)[:-3] for p in glob.glob(
            os.path.join(ROOT, "benchmarks", "*.py")) if "ArgumentParser(" in read(p)
        and not os.path.basename(p).startswith("_")] + ["benchmarks." + os.path.basename(
            os.path.dirname(p)) for p in glob.glob(os.path.join(ROOT, "benchmarks", "*",
                                                                  "__main__.py"))]))
    unknown = []
    for page in REFERENCE_PAGES:
        for command, flags in flag_uses(page):
            known = options(command) if command else every
            for flag in flags:
                if flag in OTHER_PROGRAMS_FLAGS or flag in known or (
                        flag.endswith("*") and any(k.startswith(flag[:-1]) for k in known)):
                    continue
                unknown.append("%s: %s%s" % (name(page), command + " " if command else "", flag))
    assert not unknown, "options no program of ours takes: %s (fix the page, or add the flag to " \
        "OTHER_PROGRAMS_FLAGS with whose it is)" % unknown


# Every backticked module (`platoon.elastic.node`, `benchmarks.slow_link`) and name of ours
# (`platoon.shard`, `Worker.elastic_node`, `w.global_rank`, `ctl.centre`,
# `ParamSyncRule.device_kernels()`) names something the code has.

DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
# What the docs' code calls its objects of ours (`w.sync_params()`, `ctl.serve()`, `h.wait()`;
# `opt` is a PeriodicSync or the torch optimizer it wraps, whose members it has too).
RECEIVERS = {"w": "Worker", "ctl": "Controller", "h": "SyncHandle", "handle": "SyncHandle",
             "sync": "PeriodicSync", "opt": "PeriodicSync", "rule": "ParamSyncRule",
             "callback": "PlatoonCallback", "strategy": "PlatoonStrategy",
             "local_sgd": "LocalSGD"}
# Backticked names the code deliberately lacks, each with why.
NOT_IN_THE_CODE = {
    "platoon.rules._sync_kernels": "the C extension setup.py builds from _sync_kernels.c, "
                                   "absent where no compiler was found",
    "platoon.launch.process": "docs/launcher.md names where platoon._os.process used to be",
}


class _Unchecked(Exception):
    """A name in a module that needs a framework this environment lacks (an extra)."""


def ours(load, *args):
    """`load(*args)` (an import, a lazy name's getattr); _Unchecked when what it loads needs a
    framework this environment lacks."""
    try:
        return load(*args)
    except ImportError as exc:
        cause = exc
        while cause is not None:
            missing = getattr(cause, "name", None)
            if missing and missing.split(".")[0] not in ("platoon", "benchmarks"):
                raise _Unchecked(missing) from exc
            cause = cause.__cause__
        raise


def import_ours(module):
    return ours(importlib.import_module, module)


def modules_of_ours():
    """{module name: path} for every module of the package (`__main__` aside)."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "platoon", "**", "*.py"), recursive=True):
        module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        if not module.endswith("__main__"):
            found[module[:-len(".__init__")] if module.endswith(".__init__") else module] = path
    return found


def classes_of_ours(modules):
    """{class name: [module]} for every public class defined at a module's top level, and
    {name: [module]} for every module by its last names (`mpi.tie`, `tie`: `platoon.mpi.tie`)."""
    classes, tails = {}, {}
    for module, path in modules.items():
        for node in ast.parse(read(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes.setdefault(node.name, []).append(module)
        parts = module.split(".")
        for start in range(1, len(parts)):
            tails.setdefault(".".join(parts[start:]), []).append(module)
    return classes, tails


def has_member(cls, attribute):
    """Whether instances of `cls` have `attribute`: on the class, annotated in it or a base, or
    set on self in the source of one of ours."""
    import inspect

    if hasattr(cls, attribute):
        return True
    for base in cls.__mro__:
        if attribute in base.__dict__.get("__annotations__", {}):
            return True
        if base.__module__.split(".")[0] == "platoon" and re.search(
                r"\bself\.%s\s*(:[^=\n]*)?=[^=]" % attribute, inspect.getsource(base)):
            return True
    return False


def outside_module(name):
    """Whether `name` is a top-level module not of this repository's code (`np`'s numpy, `os`;
    an installed package counts as outside even in a virtual environment inside the checkout,
    as README's commands make one)."""
    spec = importlib.util.find_spec(name)
    ours_at = [os.path.join(ROOT, folder) + os.sep for folder in ("platoon", "benchmarks",
                                                                  "tests", "examples")]
    return spec is not None and spec.origin is not None and \
        not os.path.abspath(spec.origin).startswith(tuple(ours_at))


def resolve_name(token, classes, tails):
    """Whether the dotted `token` names something: a module of ours (`platoon.mpi.tie`, or
    within platoon/ `mpi.tie`, `registry`), then attributes down from it
    (`platoon.mpi.run_node`), or attributes of a class of ours (`Worker.elastic_node`; a
    receiver: `w.global_rank`). Only modules and classes are walked past: `w.device.torch`
    checks `device`. None when the token is not ours (`np.savez`, `accelerate.local_sgd`: a
    module outside platoon wins); _Unchecked when it needs a missing framework."""
    head, *rest = token.split(".")
    if head == "benchmarks":  # files, not imported (the benchmarks need their extras)
        path = os.path.join(ROOT, "benchmarks", rest[0])
        if os.path.isdir(path):
            return True
        return os.path.isfile(path + ".py") and (len(rest) == 1 or defines(path + ".py",
                                                                           rest[1:2]))
    if head == "platoon":
        return resolve_attributes(import_ours("platoon"), rest)
    owner = RECEIVERS.get(head, head)
    if owner in classes:
        return any(resolve_attributes(getattr(import_ours(module), owner), rest)
                   for module in classes[owner])
    if head in tails and not outside_module(head):
        parts = token.split(".")  # the longest start of the token that is a module's tail
        for end in range(len(parts), 0, -1):
            modules = tails.get(".".join(parts[:end]))
            if modules:
                return any(resolve_attributes(import_ours(module), parts[end:])
                           for module in modules)
    return None


def resolve_attributes(obj, attributes):
    """Whether `attributes` lead down from the module or class `obj`; a module's own classes'
    members count as the module's (`registry.done`: a method of `registry.WorkerRegistry`)."""
    import inspect
    import types

    for attribute in attributes:
        if isinstance(obj, types.ModuleType):
            if ours(hasattr, obj, attribute):  # platoon's names load on first use
                obj = getattr(obj, attribute)
            elif hasattr(obj, "__path__") and \
                    importlib.util.find_spec("%s.%s" % (obj.__name__, attribute)) is not None:
                obj = import_ours("%s.%s" % (obj.__name__, attribute))
            else:
                return any(has_member(c, attribute) for c in vars(obj).values()
                           if inspect.isclass(c) and c.__module__ == obj.__name__)
        elif inspect.isclass(obj):
            if not has_member(obj, attribute):
                return False
            obj = inspect.getattr_static(obj, attribute, None)
        else:
            return True  # a function's or an instance's attributes: not checked
    return True


def stale_names(page, classes, tails):
    stale = []
    for span in spans(page):
        for token in DOTTED.findall(span):
            if token in NOT_IN_THE_CODE or FILE_SUFFIX.search(token):
                continue
            try:
                if resolve_name(token, classes, tails) is False:
                    stale.append(token)
            except _Unchecked:
                continue
    return sorted(set(stale))


def test_every_backticked_module_and_name_of_ours_exists():
    classes, tails = classes_of_ours(modules_of_ours())
    stale = ["%s: %s" % (name(page), token) for page in REFERENCE_PAGES
             for token in stale_names(page, classes, tails)]
    assert not stale, "names the code does not have: %s (fix the page, or add the name to " \
        "NOT_IN_THE_CODE with why)" % stale


def test_no_example_passes_a_function_named_evaluate():
    """`evaluate=evaluate` in an example would have users name their evaluation function
    `evaluate`, which shadows `import evaluate` (Hugging Face's metrics, in transformers' and
    accelerate's example scripts: an UnboundLocalError at `evaluate.load`). The docs and
    examples name it otherwise (`evaluate=evaluate_model`)."""
    paths = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md")) \
        + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True)
    found = []
    for path in paths:
        with open(path) as f:
            found += ["%s:%d" % (os.path.relpath(path, ROOT), number)
                      for number, line in enumerate(f, 1)
                      if re.search(r"\bevaluate=evaluate\b", line)]
    assert not found, "evaluate=evaluate shadows 'import evaluate': rename the function " \
        "(evaluate_model) in %s" % found
