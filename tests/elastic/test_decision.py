"""platoon.node.decision: what a quorum does in a round, from the headers alone (a table),
and the round header's wire form. Pure: no processes, no sockets."""

import hashlib

import pytest

from platoon._os.nodesettings import CentreTie, elastic_tie
from platoon.node.decision import (
    HEADER_BYTES,
    Decision,
    RoundHeader,
    decide,
    door_settings,
    layout_summary,
)

JOB = door_settings(elastic_tie())  # int8, DiLoCo 0.7 / 0.9
LAYOUT = [{"dtype": "float32", "shape": [256]}, {"dtype": "float32", "shape": [10]}]
OTHER_LAYOUT = [{"dtype": "float32", "shape": [512]}, {"dtype": "float32", "shape": [10]}]
A1, A2 = b"\1" * 32, b"\2" * 32  # two anchor digests


def _h(ready=2, round_no=3, anchor=A1, done=False, handed=False, newest=7, settings=None,
       layout=LAYOUT, version=1):
    return RoundHeader(ready, done, handed, round_no, newest, anchor if round_no >= 0
                       else bytes(32),
                       hashlib.sha256(repr(layout).encode()).digest() if ready else bytes(32),
                       JOB if settings is None else settings,
                       layout_summary(layout) if ready else "", version)


NAMES = ("a", "b", "c")
TABLE = [
    # (what happens, the headers in rank order, the expected decision)
    ("all agree: an outer round of all",
     [_h(), _h(), _h()], Decision("outer", members=(0, 1, 2))),
    ("a newer quorum heard of: leave",
     [_h(), _h(newest=9), _h()], Decision("leave")),
    ("nobody has an anchor, every centre ready: the first anchor",
     [_h(round_no=-1)] * 3, Decision("first_anchor")),
    ("nobody has an anchor, one centre awaiting its values: wait",
     [_h(round_no=-1), _h(round_no=-1, ready=1), _h(round_no=-1)], Decision("wait")),
    ("a joiner without an anchor, its centre created: healed from the lowest best rank, "
     "and an outer round in the same round, the joiner's move (nothing yet) not in the mean",
     [_h(round_no=5), _h(round_no=5), _h(round_no=-1, ready=1)],
     Decision("heal", source=0, best=5, differing=(2,), members=(0, 1))),
    ("a stale anchor: healed from the member with the most rounds, then an outer round of all",
     [_h(round_no=4, anchor=A2), _h(round_no=5), _h(round_no=5)],
     Decision("heal", source=1, best=5, differing=(0,), members=(0, 1, 2))),
    ("a joiner healed while another member's centre awaits its values: the heal alone",
     [_h(round_no=5), _h(round_no=5, ready=1), _h(round_no=-1, ready=1)],
     Decision("heal", source=0, best=5, differing=(2,))),
    ("a stale member done and handed over: healed, and it sits the outer round out",
     [_h(round_no=4, anchor=A2, done=True, handed=True), _h(round_no=5), _h(round_no=5)],
     Decision("heal", source=1, best=5, differing=(0,), members=(1, 2))),
    ("a joiner without a centre yet: wait",
     [_h(), _h(), _h(round_no=-1, ready=0)], Decision("wait")),
    ("one member done and handed over: it sits the round out",
     [_h(done=True, handed=True), _h(), _h()], Decision("outer", members=(1, 2))),
    ("every member done and handed over: the final round",
     [_h(done=True, handed=True)] * 3, Decision("final")),
    ("every member done, one never had a centre (a fixed world's node whose workers shared "
     "nothing): the end, nothing to agree",
     [_h(done=True, round_no=-1, anchor=bytes(32)), _h(ready=0, done=True, round_no=-1,
                                                      anchor=bytes(32))], Decision("end")),
    ("a fixed world's node without a centre while another trains: wait",
     [_h(round_no=-1, anchor=bytes(32)), _h(ready=0, done=True, round_no=-1,
                                            anchor=bytes(32))], Decision("wait")),
    ("a joiner with another codec: refused alone, naming the flag and the job's value",
     [_h(), _h(), _h(round_no=-1, ready=1, settings=dict(JOB, compress="int4"))],
     Decision("refuse", refused={2: "its --tie-compress int4 where a, b have int8: start it "
                                    "with the job's settings"})),
    ("another outer lr and momentum: both named",
     [_h(settings=dict(JOB, outer_lr=1.0, outer_momentum=0.0)), _h(round_no=5), _h()],
     Decision("refuse", refused={0: "its --tie-outer-lr 1.0 where b, c have 0.7; "
                                    "--tie-outer-momentum 0.0 where b, c have 0.9: start it "
                                    "with the job's settings"})),
    ("another rule",
     [_h(), _h(settings=door_settings(CentreTie(3.0, outer="easgd", compress="int8"))), _h()],
     Decision("refuse", refused={1: "its --tie-beta 0.5 where a, c have (not given); "
                                    "--tie-outer easgd where a, c have diloco; "
                                    "--tie-outer-lr (not given) where a, c have 0.7; "
                                    "--tie-outer-momentum (not given) where a, c have 0.9: "
                                    "start it with the job's settings"})),
    ("two nodes, one anchored: the anchored one is the job (a tie goes to the most rounds)",
     [_h(round_no=-1, ready=1, settings=dict(JOB, compress="float32")), _h(round_no=8)],
     Decision("refuse", refused={0: "its --tie-compress float32 where b has int8: start it "
                                    "with the job's settings"})),
    ("two nodes at the start, neither anchored: the lower rank is the job",
     [_h(round_no=-1), _h(round_no=-1, settings=dict(JOB, compress="int4"))],
     Decision("refuse", refused={1: "its --tie-compress int4 where a has int8: start it with "
                                    "the job's settings"})),
    ("a joiner with another model: refused once its centre exists",
     [_h(), _h(), _h(round_no=-1, ready=1, layout=OTHER_LAYOUT)],
     Decision("refuse", refused={2: "its model differs from the job's: its centre holds 2 "
                                    "array(s): 522 float32, where a, b hold 2 array(s): 266 "
                                    "float32: every node must run the same model"})),
    ("the same counts in another order: said so",
     [_h(), _h(), _h(layout=list(reversed(LAYOUT)))],
     Decision("refuse", refused={2: "its model differs from the job's: its centre holds 2 "
                                    "array(s): 266 float32, where a, b hold 2 array(s): 266 "
                                    "float32 (another shape or order): every node must run "
                                    "the same model"})),
    ("a header of another version: refused before its settings are read",
     [_h(), _h(), _h(version=-1, settings={})],
     Decision("refuse", refused={2: "its round header is not one this platoon reads (version "
                                    "-1 where a, b have 1): run the same platoon on every "
                                    "node"})),
]


@pytest.mark.parametrize("headers, expected", [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_the_round_is_decided_from_the_headers(headers, expected):
    assert decide(headers, 7, NAMES[:len(headers)]) == expected


def test_a_header_reads_back_whole_at_a_fixed_size():
    header = _h(round_no=12, done=True, settings=dict(JOB, compress="int4"))
    packed = header.pack()
    assert len(packed) == HEADER_BYTES == len(_h(ready=0, round_no=-1).pack())
    assert RoundHeader.unpack(packed) == header


def test_a_header_that_cannot_be_read_is_of_no_version():
    packed = bytearray(_h().pack())
    packed[-50:] = b"x" * 50  # not JSON any more
    assert RoundHeader.unpack(bytes(packed)).version == -1
    assert RoundHeader.unpack(b"short").version == -1


def test_a_long_layout_summary_is_shortened_the_digest_stays():
    layout = [{"dtype": "<V%d" % (i + 1), "shape": [2]} for i in range(60)]  # a long summary
    header = _h(layout=layout)
    assert len(header.pack()) == HEADER_BYTES
    read = RoundHeader.unpack(header.pack())
    assert read.layout.endswith("...") and read.layout_digest == header.layout_digest


def test_the_door_holds_only_what_the_rule_reads():
    assert door_settings(CentreTie(1.0, outer="diloco", beta=0.3)) == {
        "compress": "float32", "outer": "diloco", "outer_lr": 0.7, "outer_momentum": 0.9}
    assert door_settings(CentreTie(1.0, outer="easgd", outer_lr=2.0)) == {
        "compress": "float32", "outer": "easgd", "beta": 0.5}
