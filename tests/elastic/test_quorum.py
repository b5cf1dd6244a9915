"""platoon.elastic.quorum: the membership rule (who is in the next quorum, and when) and its
settings, as pure logic: no processes, no sockets."""


import pytest

from platoon.elastic import MembershipSettings, Quorum
from platoon.elastic.quorum import Membership


def test_membership_issues_after_grace_and_drops_the_silent():
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=1.0, join_grace_s=0.5))
    m.heartbeat("b", "h:2", 0, now=0.0)
    assert m.tick(0.1) is None  # one node: fewer than min_nodes
    m.heartbeat("a", "h:1", 0, now=0.2)
    assert m.tick(0.3) is None  # the grace window for joiners
    q = m.tick(0.8)
    assert q == Quorum(1, ("a", "b"), ("h:1", "h:2")) and q.rank_of("b") == 1
    assert m.tick(0.9) is None  # nothing changed
    m.heartbeat("a", "h:1", 0, now=1.5)
    assert m.tick(1.6) is None  # b silent 1.6 s, but 1 node < min_nodes: quorum 1 stays
    m.heartbeat("c", "h:3", 7, now=1.7)  # c saw quorum 7 (a lighthouse before a restart)
    assert m.tick(1.8) is None
    assert m.tick(2.4) == Quorum(8, ("a", "c"), ("h:1", "h:3"))
    m.leave("c")
    assert m.tick(2.45) is None  # a alone
    with pytest.raises(ValueError, match="node 'z' is not in quorum 8"):
        m.quorum.rank_of("z")


def test_a_member_whose_group_broke_gets_a_new_id_for_the_same_members():
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=5.0, join_grace_s=0.1))
    m.heartbeat("a", "h:1", 0, now=0.0)
    m.heartbeat("b", "h:2", 0, now=0.0)
    assert m.tick(0.05) is None
    first = m.tick(0.2)
    m.heartbeat("a", "h:1", first.id, now=0.3, broken=first.id - 1)  # an old quorum: ignored
    assert m.tick(0.5) is None
    m.heartbeat("a", "h:1", first.id, now=0.6, broken=first.id)
    assert m.tick(0.65) is None  # the grace window
    assert m.tick(0.8) == Quorum(first.id + 1, ("a", "b"), ("h:1", "h:2"))
    m.heartbeat("a", "h:1", first.id, now=0.9, broken=first.id)  # stale: no third id
    assert m.tick(1.2) is None


def test_a_member_the_others_cannot_reach_is_out_of_the_quorums_until_it_moves():
    """c's data plane is unreachable from a and b (its --host an address only it sees): once
    either reports it, c is out of the next quorum (and told why); a reporter that names
    every other member is not counted; c back from another address, or after
    UNREACHABLE_FOR_S, is in again."""
    from platoon.elastic.quorum import UNREACHABLE_FOR_S
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=1e9, join_grace_s=0.1))
    for name in "abc":
        m.heartbeat(name, "10.0.0.%s:1" % name, 0, now=0.0, incarnation=name)
    m.tick(0.0)
    first = m.tick(0.2)
    assert first.members == ("a", "b", "c")
    m.heartbeat("c", "10.0.0.c:1", 1, now=0.3, incarnation="c", unreachable=["a", "b"])
    assert m.tick(0.4) is None and m.tick(0.6) is None  # c names everyone: not counted
    m.heartbeat("a", "10.0.0.a:1", 1, now=0.7, incarnation="a", unreachable=["c", "zz"])
    assert m.tick(0.75) is None  # the grace window
    second = m.tick(0.9)
    assert second.members == ("a", "b")
    assert "data plane at 10.0.0.c:1 was unreachable from a: give its --host an address the " \
           "other nodes reach" in m.excluded(1.0)["c"]
    assert m.tick(5.0) is None  # c stays out
    m.heartbeat("c", "10.0.0.9:1", 1, now=5.1, incarnation="c")  # another address
    assert m.tick(5.1).members == ("a", "b", "c")  # a joiner to a running quorum: at once
    m.heartbeat("b", "10.0.0.b:1", 3, now=6.0, incarnation="b", unreachable=["c"])
    m.tick(6.0)
    assert m.tick(6.2).members == ("a", "b")
    assert m.tick(6.2 + UNREACHABLE_FOR_S).members == ("a", "b", "c")  # tried again


def test_a_member_reported_gone_is_out_once_silent_for_a_second_not_the_heartbeat_timeout():
    """c's process dies (its data plane refuses a and b as their round breaks): reported gone
    by a, c is out of the next quorum once silent for GONE_SILENCE_S, not after the 30 s
    heartbeat timeout. A member reported gone that still heartbeats stays (its report is
    dropped); so does one reported by a node outside the quorum; c's next process (another
    incarnation) is not covered by the report on the last; the silence scales with the
    lighthouse's pace."""
    from platoon.elastic.quorum import GONE_SILENCE_PACES, GONE_SILENCE_S
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=30.0, join_grace_s=0.1))
    for name in "abc":
        m.heartbeat(name, "h:" + name, 0, now=0.0, incarnation=name)
    m.tick(0.0)
    assert m.tick(0.2).members == ("a", "b", "c")
    m.heartbeat("z", "h:z", 1, now=0.3, incarnation="z", gone=["c"], gone_of=1)  # no member
    m.heartbeat("b", "h:b", 1, now=0.3, incarnation="b", gone=["b"], gone_of=1)  # itself
    assert m.tick(0.2 + GONE_SILENCE_S + 0.1).members == ("a", "b", "c", "z")  # (z joins)
    m.heartbeat("a", "h:a", 2, now=2.1, incarnation="a", gone=["b"], gone_of=2)
    m.heartbeat("b", "h:b", 2, now=2.2, incarnation="b")  # b is alive: its report dropped
    for name in "abz":
        m.heartbeat(name, "h:" + name, 2, now=3.0, incarnation=name)
    assert m.tick(3.1) is None  # c silent since 0.0, but not reported: the timeout decides
    m.heartbeat("a", "h:a", 2, now=3.2, incarnation="a", gone=["b", "c"], gone_of=2)
    m.heartbeat("b", "h:b", 2, now=3.3, incarnation="b")
    assert m.tick(3.35) is None  # the grace window
    assert m.tick(3.5).members == ("a", "b", "z")  # c out, 3.5 s after its last heartbeat
    # c dies again at 10.0 (its next process), a reports it at 10.2: out 1 s after it died
    m.heartbeat("c", "h:c", 3, now=4.0, incarnation="c2")
    assert m.tick(4.0).members == ("a", "b", "c", "z")
    for name in "abz":
        m.heartbeat(name, "h:" + name, 4, now=10.0, incarnation=name)
    m.heartbeat("c", "h:c", 4, now=10.0, incarnation="c2")
    m.heartbeat("a", "h:a", 4, now=10.2, incarnation="a", gone=["c"], gone_of=4)
    for name in "abz":
        m.heartbeat(name, "h:" + name, 4, now=10.9, incarnation=name)
    assert m.tick(10.9) is None and m.tick(10.0 + GONE_SILENCE_S + 0.05) is None  # grace
    assert m.tick(10.0 + GONE_SILENCE_S + 0.2).members == ("a", "b", "z")
    m.pace_s = 2.0  # many nodes: they heartbeat every 2 s, so 3 paces of silence
    assert m.gone_silence_s == GONE_SILENCE_PACES * 2.0
    m.pace_s = 20.0
    assert m.gone_silence_s == 30.0  # never past the heartbeat timeout


def test_a_joiner_to_a_running_quorum_waits_for_no_grace_window_but_joiners_in_a_burst_do():
    """Joiners alone (every member of the running quorum live, at its address): the next
    quorum comes at the next tick once the running one is a grace window old, so that a burst
    of joiners makes one quorum per window, not one each; a leaver still waits the window."""
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=1e9, join_grace_s=0.5))
    for name in "ab":
        m.heartbeat(name, "h:" + name, 0, now=0.0)
    assert m.tick(0.0) is None and m.tick(0.4) is None  # the job's start: the grace window
    assert m.tick(0.5).members == ("a", "b")
    m.heartbeat("c", "h:c", 0, now=3.0)  # the quorum is 2.5 s old: c is taken at once
    assert m.tick(3.0).members == ("a", "b", "c")
    m.heartbeat("d", "h:d", 0, now=3.1)  # a burst: the quorum is 0.1 s old
    m.heartbeat("e", "h:e", 0, now=3.3)
    assert m.tick(3.1) is None and m.tick(3.4) is None
    assert m.tick(3.5).members == ("a", "b", "c", "d", "e")
    m.leave("e")
    m.heartbeat("f", "h:f", 0, now=9.0)  # a leaver and a joiner: the grace window
    assert m.tick(9.0) is None
    assert m.tick(9.5).members == ("a", "b", "c", "d", "f")
    m.heartbeat("a", "h:a2", 0, now=20.0)  # a member at another address: the window too
    assert m.tick(20.0) is None
    assert m.tick(20.5).addresses[0] == "h:a2"


def test_membership_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="min_nodes must be an integer >= 1"):
        MembershipSettings(min_nodes=0)
    with pytest.raises(ValueError, match="heartbeat_timeout_s must be > 0"):
        MembershipSettings(heartbeat_timeout_s=0)


def test_each_quorum_meets_under_its_own_random_prefix():
    """The lighthouse gives each quorum a random nonce (signed in its reply), and its group
    meets under a store prefix holding it: unguessable without the secret, and two quorums of
    one id (a lighthouse restarted before any node reported) never share a group."""
    from platoon.elastic.dataplane import store_prefix
    quorums = []
    for _ in range(2):  # a lighthouse, then another started afresh
        m = Membership(MembershipSettings(min_nodes=1, join_grace_s=0.0))
        m.heartbeat("a", "h:1", 0, now=0.0)
        quorums.append(m.tick(0.1))
    first, again = quorums
    assert first.id == again.id == 1 and len(first.nonce) == 32
    assert store_prefix(first) != store_prefix(again)
    assert store_prefix(first) == "platoon/quorum/1/%s/" % first.nonce
    assert Quorum.from_wire(first.to_wire()).nonce == first.nonce


def test_a_gone_report_counts_out_the_process_of_its_quorum_only_and_once():
    """A report is on the processes of the quorum whose round broke (`gone_of`), and counts
    once, though its reporter sends it with every heartbeat until its next group forms: c1
    dies and a reports it: c1 is out after a second of silence, even once quorum 2 (a
    joiner's) holds it, and c's next process c2 is not counted out by the report (nor by
    b's on quorum 1, come later) though silent for longer than a second; b, heard from
    after a reported it in quorum 4 (its data plane refused a: a firewall), stays however
    long it is silent within the 30 s heartbeat timeout."""
    from platoon.elastic.quorum import GONE_SILENCE_S
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=30.0, join_grace_s=0.1))
    for name in "abc":
        m.heartbeat(name, "h:" + name, 0, now=0.0, incarnation=name + "1")
    m.tick(0.0)
    assert m.tick(0.2).members == ("a", "b", "c")
    m.heartbeat("d", "h:d", 0, now=0.5, incarnation="d1")  # c1 dies at 0.5; d joins
    m.heartbeat("c", "h:c", 1, now=0.5, incarnation="c1")
    assert m.tick(0.5).members == ("a", "b", "c", "d")  # quorum 2, with c1
    for now in (0.8, 1.1, 1.4, 1.7):  # a's round of quorum 1 broke: its report on it goes on
        for name in "abd":
            m.heartbeat(name, "h:" + name, 2, now=now, incarnation=name + "1",
                        gone=["c"] if name == "a" else (), gone_of=1)
        assert m.tick(now) is None
    assert m.holder("c") is None  # out after a second of silence
    assert m.tick(1.9).members == ("a", "b", "d")  # quorum 3
    m.heartbeat("c", "h:c2", 0, now=1.95, incarnation="c2")  # c's next process
    for now in (2.0, 2.4, 2.8, 3.2, 3.6):  # a's report goes on, b's (late) comes; c2 silent
        for name in "abd":
            m.heartbeat(name, "h:" + name, 3, now=now, incarnation=name + "1",
                        gone=["c"] if name in "ab" else (), gone_of=1)
        quorum = m.tick(now)
        assert quorum is None or quorum.members == ("a", "b", "c", "d")  # quorum 4, with c2
    assert m.holder("c") == "c2" and 3.6 - 1.95 > GONE_SILENCE_S
    assert m.quorum.id == 4
    # b: reported gone in quorum 4 by a, heard from after, then silent
    m.heartbeat("a", "h:a", 4, now=3.7, incarnation="a1", gone=["b"], gone_of=4)
    m.heartbeat("b", "h:b", 4, now=3.75, incarnation="b1")
    for now in (3.8, 4.2, 4.6, 5.0, 5.4):
        for name in "acd":
            m.heartbeat(name, "h:" + (name if name != "c" else "c2"), 4, now=now,
                        incarnation=name + ("2" if name == "c" else "1"),
                        gone=["b"] if name == "a" else (), gone_of=4)
        assert m.tick(now) is None
    assert m.holder("b") == "b1" and 5.4 - 3.75 > GONE_SILENCE_S
