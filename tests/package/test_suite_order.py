"""The suite's order: the files conftest.py starts first (helpers.STARTED_FIRST) exist, and
pytest.ini has xdist keep the order they are collected in."""

import configparser
import os

from helpers import ROOT, STARTED_FIRST


def test_the_files_started_first_exist_once_each():
    missing = [p for p in STARTED_FIRST if not os.path.isfile(os.path.join(ROOT, p))]
    assert not missing, "tests/helpers.py's STARTED_FIRST names files that are gone: %s" % missing
    assert len(set(STARTED_FIRST)) == len(STARTED_FIRST), STARTED_FIRST


def test_xdist_hands_the_files_out_in_collection_order():
    ini = configparser.ConfigParser()
    ini.read(os.path.join(ROOT, "pytest.ini"))
    options = ini["pytest"]["addopts"].split()
    assert "--dist" in options and options[options.index("--dist") + 1] == "loadfile"
    assert "--no-loadscope-reorder" in options, options
