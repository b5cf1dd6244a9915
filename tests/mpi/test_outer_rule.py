"""A user's own outer rule (``--tie-outer MODULE:FACTORY``): named on the command line, made on
every node, run by the one centre tie of a fixed world; refused with what to do when it cannot
be imported or is no rule."""

import argparse
import os
import re

import numpy as np
import pytest
from test_mpi import mpi_job  # noqa: F401 (the fixture)

from platoon._os.nodesettings import CentreTie, outer_rule_argument
from platoon.errors import PlatoonError
from platoon.node.decision import door_settings
from platoon.node.outer import outer_rule

from helpers import PROCS

ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (PROCS, os.environ.get("PYTHONPATH"))
                                         if p)}


def test_an_outer_rule_is_easgd_diloco_or_a_module_and_factory():
    assert outer_rule_argument("own_outer_rule:half_steps") == "own_outer_rule:half_steps"
    for bad in ("bogus", "a:b:c", ":f", "mod:"):
        with pytest.raises(argparse.ArgumentTypeError, match="MODULE:FACTORY"):
            outer_rule_argument(bad)
    with pytest.raises(ValueError, match="CentreTie outer must be one of easgd, diloco or "
                                         "MODULE:FACTORY"):
        CentreTie(outer="bogus")
    own = CentreTie(outer="pkg.rules:make", outer_lr=0.5)
    assert door_settings(own) == {"compress": "float32", "outer": "pkg.rules:make",
                                  "outer_lr": 0.5, "outer_momentum": 0.9, "beta": 0.5}


def test_a_users_rule_is_made_from_its_factory_or_refused_saying_what_to_do(monkeypatch):
    monkeypatch.syspath_prepend(PROCS)
    rule = outer_rule(CentreTie(outer="own_outer_rule:half_steps"))
    anchor = np.zeros(3, np.float32)
    rule.step(anchor, np.zeros(3, np.float32), np.full(3, 2.0, np.float32))
    assert (anchor == 1.0).all() and rule.describe() == "own rule: half steps"
    with pytest.raises(PlatoonError, match=r"--tie-outer no_such_module:f: cannot import "
                                           r"no_such_module .* importable on every node"):
        outer_rule(CentreTie(outer="no_such_module:f"))
    with pytest.raises(PlatoonError, match="own_outer_rule has no nothing_here"):
        outer_rule(CentreTie(outer="own_outer_rule:nothing_here"))
    with pytest.raises(PlatoonError, match=r"not_a_rule\(tie\) gave .* which has no "
                                           r"moves_centres, step, move_centre, describe"):
        outer_rule(CentreTie(outer="own_outer_rule:not_a_rule"))


def test_a_fixed_world_ties_its_centres_with_a_users_own_rule(mpi_job):  # noqa: F811
    """Two nodes, the rule named on the command line: every node makes it, the rounds apply it
    (each node's summary names it), and the job ends on one centre."""
    job = mpi_job("-", "--tie-every-s", "0.02", "--tie-outer", "own_outer_rule:half_steps",
                  "--", os.path.join(PROCS, "tie_regression_worker.py"), "300",
                  env_extra=ON_PATH)
    assert job.wait(60) == 0, job.output
    found = re.findall(r"platoon.mpi: node (\d): the centre tie sent \d+ bytes from this node: "
                       r"(\d+) outer round\(s\)[^\n]*; own rule: half steps", job.output)
    assert sorted(node for node, _ in found) == ["0", "1"], job.output
    assert all(int(rounds) > 0 for _, rounds in found), job.output


def test_a_rule_that_cannot_be_imported_ends_the_job_saying_so(mpi_job):  # noqa: F811
    job = mpi_job("-", "--tie-every-s", "0.02", "--tie-outer", "no_such_module:f",
                  "--", os.path.join(PROCS, "tie_regression_worker.py"), "40")
    assert job.wait(60) != 0, job.output
    assert "--tie-outer no_such_module:f: cannot import no_such_module" in job.output, \
        job.output
