"""The consensus core, scripted step by step: elections, replication, reads, transfers,
membership, and the safeguards that keep acknowledged entries, each shown failing when it is
switched off."""

from __future__ import annotations

import dataclasses

from raftgroup import Group
from sqsq.raft import (
    ConfChange,
    ConfOp,
    Entry,
    Message,
    MsgType,
    RaftConfig,
    RaftNode,
    Role,
    Safeguards,
    SnapshotMeta,
)


def test_a_leader_is_elected_and_its_entries_reach_every_replica() -> None:
    g = Group()
    leader = g.elect("a")
    assert [n.lead for n in g.nodes.values()] == ["a", "a", "a"]
    for i in range(5):
        assert leader.propose(b"e%d" % i) is not None
    g.flush()
    # The followers were sent an append in this round: they learn the last commit with the
    # next round's heartbeat.
    g.tick(2)
    assert g.payloads("a") == g.payloads("b") == g.payloads("c") == [
        b"e0", b"e1", b"e2", b"e3", b"e4"]


def test_a_commit_rides_on_the_next_append_or_goes_on_the_next_tick() -> None:
    """A commit costs no round of its own while entries keep coming: the next append
    carries it. When none comes, the followers learn it on the leader's next tick, a
    heartbeat or not."""
    g = Group(config=RaftConfig(election_ticks=10, heartbeat_ticks=5))
    leader = g.elect("a")
    sent: list[Message] = []
    step = g.nodes["b"].step
    g.nodes["b"].step = lambda m: (sent.append(m), step(m))  # type: ignore[method-assign]
    leader.propose(b"e0")
    g.flush()
    assert g.payloads("a") == [b"e0"] and g.payloads("b") == []
    assert [bool(m.entries) for m in sent] == [True]  # no commit-only append
    leader.propose(b"e1")
    g.flush()
    assert g.payloads("b") == [b"e0"]  # e0's commit came with e1
    assert leader.heartbeat_elapsed == 0
    g.tick(only=["a"])  # not a heartbeat tick
    assert not any(m.type is MsgType.HEARTBEAT for m in sent)
    assert g.payloads("a") == g.payloads("b") == g.payloads("c") == [b"e0", b"e1"]


def test_a_busy_groups_round_sends_nothing_to_a_follower_appended_since_the_last() -> None:
    """A follower sent an append since the last heartbeat round has heard from its leader:
    the round sends it nothing, not even the commit it lacks. That rides on the next append
    or, when none comes, on the next round's heartbeat (a commit-only append each round
    cost a busy group two messages and two Readys per follower, and a follower's apply
    waits for company anyway). A follower with a probe out is heartbeated all the same,
    since the answer is what unblocks it."""
    g = Group()
    leader = g.elect("a")

    def tick() -> list[tuple[MsgType, str, int]]:
        leader.tick()
        if not leader.has_ready():
            return []
        rd = leader.ready()
        leader.advance(rd)
        g.inbox.extend(rd.messages)
        g.flush()
        return [(m.type, m.to, m.commit) for m in rd.messages]

    leader.propose(b"e0")
    g.flush()
    committed = leader.log.commit
    assert g.nodes["b"].log.commit < committed  # e0's commit has not reached the followers
    assert tick() == []  # they were appended to since the last round
    assert g.nodes["b"].log.commit < committed
    assert tick() == [(MsgType.HEARTBEAT, "b", committed), (MsgType.HEARTBEAT, "c", committed)]
    assert g.nodes["b"].log.commit == g.nodes["c"].log.commit == committed
    leader.propose(b"e1")
    g.flush()
    probing = leader.progress["b"]
    probing.become_probe()
    probing.paused = True  # a probe out, unanswered
    assert [(kind, to) for kind, to, _ in tick()] == [(MsgType.HEARTBEAT, "b")]  # c: nothing


def test_appends_and_answers_made_between_two_readys_go_as_one() -> None:
    """Three proposals made while the leader's last Ready was being written: one append to
    each follower carries all three, and each follower answers once."""
    g = Group(config=RaftConfig(election_ticks=10, heartbeat_ticks=1, max_append_bytes=20))
    leader = g.elect("a")
    for i in range(3):
        leader.propose(b"e%d" % i)
    leader.propose(b"x" * 20)  # past the bound: an append of its own
    rd = leader.ready()
    appends = [m for m in rd.messages if m.type is MsgType.APPEND]
    assert sorted((m.to, [e.data for e in m.entries]) for m in appends) == [
        ("b", [b"e0", b"e1", b"e2"]), ("b", [b"x" * 20]),
        ("c", [b"e0", b"e1", b"e2"]), ("c", [b"x" * 20])]
    leader.advance(rd)
    b = g.nodes["b"]
    for m in appends:
        if m.to == "b":
            b.step(m)
    rd_b = b.ready()
    answers = rd_b.messages
    g.applied["b"].extend(rd_b.committed)
    b.advance(rd_b)
    assert [(m.type, m.index) for m in answers] == [(MsgType.APPEND_RESP,
                                                     leader.log.last_index())]
    g.inbox.extend(m for m in [*appends, *answers] if m.to != "b")
    g.flush()
    g.tick(2)  # (the commit goes with the round after the append's)
    assert g.payloads("a") == g.payloads("b") == g.payloads("c") == [
        b"e0", b"e1", b"e2", b"x" * 20]


def test_a_follower_refuses_to_propose_and_names_the_leader() -> None:
    g = Group()
    g.elect("a")
    assert g.nodes["b"].propose(b"x") is None
    assert g.nodes["b"].lead == "a"


def test_a_leader_counts_its_own_entry_only_once_it_is_durable() -> None:
    g = Group(("a",))
    leader = g.elect("a")
    term, index = leader.propose(b"x")  # type: ignore[misc]
    assert leader.log.commit < index  # nothing persisted yet: not committed
    rd = leader.ready()
    assert rd.entries[-1].index == index and not any(e.index == index for e in rd.committed)
    leader.advance(rd)
    assert leader.log.commit == index


def test_a_commit_is_acted_on_at_once_only_while_no_ready_is_out() -> None:
    """A host may act on a Ready that only commits in the turn its quorum's answers come
    (``commit_only``), but not while its own write of the entry is still out: the
    followers' answers commit an entry the leader holds only in a Ready it has not
    advanced, and applying it then would apply before the leader's own persist."""
    g = Group()
    leader = g.elect("a")
    _, index = leader.propose(b"x")  # type: ignore[misc]
    rd = leader.ready()  # the leader's write of the entry: out, not yet durable
    for peer in ("b", "c"):
        for m in rd.messages:
            if m.to == peer:
                g.nodes[peer].step(m)
        rd_f = g.nodes[peer].ready()
        g.nodes[peer].advance(rd_f)
        for m in rd_f.messages:
            leader.step(m)
    assert leader.log.commit == index  # the two followers made it
    assert not leader.commit_only()
    leader.advance(rd)
    assert leader.commit_only() and leader.has_ready()
    done = leader.ready()
    assert [e.index for e in done.committed] == [index] and not done.entries
    assert not done.messages and done.hard_state is not None
    leader.advance(done)
    assert not leader.has_ready()


def test_a_cut_off_node_neither_raises_its_term_nor_deposes_the_leader_when_back() -> None:
    """Finding 8: pre-vote and check-quorum."""
    g = Group()
    leader = g.elect("a")
    term = leader.term
    g.isolate("c")
    g.tick(60)
    assert g.nodes["c"].term == term  # pre-votes went unanswered: no new term
    g.heal()
    g.tick(5)
    assert g.leader() is leader and leader.term == term


def test_without_pre_vote_a_cut_off_node_deposes_the_leader_when_back() -> None:
    """The mutant of the test above: the healthy leader loses its term to a node that was
    cut off."""
    g = Group(config=RaftConfig(election_ticks=10, heartbeat_ticks=1, pre_vote=False,
                                check_quorum=False))
    leader = g.elect("a")
    term = leader.term
    g.isolate("c")
    g.tick(60, only=["c"])
    assert g.nodes["c"].term > term
    g.heal()
    g.tick(20, only=["c"])
    assert leader.term > term  # a's term was taken from it: it led no longer


def test_a_leader_cut_off_from_the_majority_stands_down() -> None:
    g = Group()
    leader = g.elect("a")
    g.isolate("a")
    g.tick(30, only=["a"])  # two check-quorum rounds in a row without a word from b or c
    assert leader.role is Role.FOLLOWER


def _followers_stalled(rounds: int | None = None) -> tuple[Group, RaftNode, int]:
    """a leads; b and c fall silent for 19 ticks, neither answering nor ticking (what
    followers whose loops are blocked in a slow fsync look like: on one machine, one disk
    stall holds them all), then come back."""
    config = RaftConfig(election_ticks=10, heartbeat_ticks=1)  # (the default rounds)
    if rounds is not None:
        config = dataclasses.replace(config, check_quorum_rounds=rounds)
    g = Group(config=config)
    leader = g.elect("a")
    term = leader.term
    g.isolate("a")
    g.tick(19, only=["a"])  # (19 ticks take in one whole round of 10, never two)
    g.heal()
    g.tick(5)
    return g, leader, term


def test_a_leader_leads_on_through_its_followers_stall_shorter_than_two_rounds() -> None:
    g, leader, term = _followers_stalled()
    assert g.leader() is leader and leader.term == term
    assert leader.propose(b"after") is not None
    g.flush()
    g.tick(2)  # (the followers learn the commit with the round after the append's)
    assert g.payloads("b")[-1:] == [b"after"]


def test_with_one_check_quorum_round_its_followers_stall_deposes_the_leader() -> None:
    """The mutant of the test above: the leader stood down, and the group has none until
    an election (calls in flight fail, new ones wait)."""
    _, leader, term = _followers_stalled(rounds=1)
    assert not leader.is_leader()


def _stale_success(g: Group, leader_id: str, frm: str, index: int, term: int) -> None:
    g.nodes[leader_id].step(Message(MsgType.APPEND_RESP, leader_id, frm, term, index=index))


def _leader_ahead_of_followers(safeguards: Safeguards) -> Group:
    """a leads term 2 after c led term 1; b and c are cut off, so a's new entry is held by
    a alone. c's acknowledgement from term 1 then arrives late."""
    g = Group(safeguards=safeguards)
    g.elect("c")
    g.elect("a")
    g.isolate("a")
    g.nodes["a"].propose(b"only-on-a")
    g.flush()
    return g


def test_an_acknowledgement_from_an_older_term_is_ignored() -> None:
    """Finding 4: a stale success must not make the leader commit an entry nobody holds."""
    g = _leader_ahead_of_followers(Safeguards())
    a = g.nodes["a"]
    commit = a.log.commit
    _stale_success(g, "a", "c", a.log.last_index(), a.term - 1)
    g.flush()
    assert a.log.commit == commit


def test_without_terms_on_acknowledgements_a_stale_one_commits_what_no_follower_holds() -> None:
    g = _leader_ahead_of_followers(Safeguards(stale_responses_ignored=False))
    a = g.nodes["a"]
    _stale_success(g, "a", "c", a.log.last_index(), a.term - 1)
    g.flush()
    assert a.log.commit == a.log.last_index()
    assert g.nodes["c"].log.last_index() < a.log.commit  # committed, held by a alone


def _repeat_old_append(safeguards: Safeguards) -> Group:
    """b holds entries 1..12; the leader's old append of entry 7 (70 KB, as a group commit of
    many commands is) arrives again."""
    g = Group(("a", "b"), safeguards=safeguards)
    leader = g.elect("a")
    g.cut.add(("b", "a"))  # b's acknowledgements are late: its commit stays behind
    big = b"x" * 70_000
    for i in range(10):
        leader.propose(big if i == 4 else b"e%d" % i)
    g.flush()
    b = g.nodes["b"]
    assert b.log.last_index() == 12 and b.log.commit < 7  # membership, no-op, 10 entries
    old = Message(MsgType.APPEND, "b", "a", leader.term, log_term=leader.term, index=6,
                  entries=(b.log.entries[6],), commit=6)
    b.step(old)
    g.flush()
    return g


def test_a_repeated_append_of_a_large_entry_truncates_nothing() -> None:
    """Finding 2: truncation only at a conflict, whatever the entry's size."""
    g = _repeat_old_append(Safeguards())
    assert g.nodes["b"].log.last_index() == 12


def test_without_the_conflict_rule_a_repeated_append_drops_acknowledged_entries() -> None:
    g = _repeat_old_append(Safeguards(truncate_only_at_conflict=False))
    assert g.nodes["b"].log.last_index() == 7  # 8..12 gone, though acknowledged


def _two_changes_then_split(safeguards: Safeguards) -> tuple[Group, object]:
    """Finding 3's schedule: a, b, c vote and n learns; a appends 'remove c' and 'promote n'
    back to back, then {a, n} and {b, c} are cut apart."""
    g = Group(("a", "b", "c"), learners=("n",), safeguards=safeguards)
    leader = g.elect("a")
    leader.propose(b"warm")
    g.flush()
    first = leader.propose_conf_change(ConfChange(ConfOp.REMOVE, "c"))
    assert first is not None
    second = leader.propose_conf_change(ConfChange(ConfOp.PROMOTE, "n"))
    # Only a and n hear of the changes.
    for other in ("b", "c"):
        g.cut.update({("a", other), (other, "a"), ("n", other), (other, "n")})
    g.flush()
    return g, second


def test_a_second_membership_change_waits_for_the_first_to_commit() -> None:
    g, second = _two_changes_then_split(Safeguards())
    assert second is None


def test_two_uncommitted_membership_changes_let_two_majorities_commit_apart() -> None:
    g, second = _two_changes_then_split(Safeguards(one_conf_change_at_a_time=False))
    assert second is not None
    a = g.nodes["a"]
    a.propose(b"X")
    g.flush()
    g.tick(40, only=["b", "c"])  # b and c still use {a, b, c}: a majority of two
    other = g.nodes["b"] if g.nodes["b"].is_leader() else g.nodes["c"]
    assert other.is_leader()
    other.propose(b"Y")
    g.flush()
    committed_a = {e.index: e.data for e in g.applied["a"]}
    committed_b = {e.index: e.data for e in g.applied[other.id]}
    clash = [i for i in committed_a.keys() & committed_b.keys()
             if committed_a[i] != committed_b[i]]
    assert clash, "both sides committed, at the same index, different entries"


def _old_snapshot_after_commit(safeguards: Safeguards) -> Group:
    g = Group(("a", "b"), safeguards=safeguards)
    leader = g.elect("a")
    for i in range(10):
        leader.propose(b"e%d" % i)
    g.flush()
    g.tick(2)  # (the commit goes with the round after the append's)
    b = g.nodes["b"]
    assert b.log.commit == 12
    old = SnapshotMeta(5, leader.term, g.conf)
    b.step(Message(MsgType.SNAPSHOT, "b", "a", leader.term, snapshot=old))
    return g


def test_a_snapshot_older_than_the_commit_is_refused() -> None:
    """Finding 9."""
    g = _old_snapshot_after_commit(Safeguards())
    b = g.nodes["b"]
    assert b.log.last_index() == 12 and b.log.commit == 12
    assert b.ready().snapshot is None


def test_without_the_refusal_an_old_snapshot_drops_committed_entries() -> None:
    g = _old_snapshot_after_commit(Safeguards(refuse_snapshot_behind_commit=False))
    b = g.nodes["b"]
    assert b.log.last_index() == 5


def test_a_read_is_confirmed_by_a_majority_and_refused_by_a_cut_off_leader() -> None:
    g = Group()
    leader = g.elect("a")
    assert leader.read_index(b"r1")
    rd = leader.ready()
    assert not rd.read_states  # a heartbeat round first
    g.inbox.extend(rd.messages)
    leader.advance(rd)
    g.flush()
    g.isolate("a")
    assert leader.read_index(b"r2")
    g.flush()
    states = [rs for rs in leader.ready().read_states]
    assert [rs.context for rs in states] == []  # r1 was handed out in flush; r2 waits
    assert leader.pending_reads and leader.pending_reads[0][0] == b"r2"


def test_a_leadership_transfer_hands_over_within_one_round() -> None:
    g = Group()
    leader = g.elect("a")
    leader.propose(b"x")
    g.flush()
    assert leader.transfer_leadership("c")
    g.flush()
    assert g.nodes["c"].is_leader() and not leader.is_leader()
    assert g.payloads("c")[-1:] == [b"x"]


def test_a_learner_never_campaigns_and_is_promoted_only_once_caught_up() -> None:
    g = Group(("a", "b", "c"), learners=("n",))
    term = g.nodes["n"].term
    g.tick(100, only=["n"])
    assert g.nodes["n"].role is Role.FOLLOWER and g.nodes["n"].term == term
    leader = g.elect("a")
    g.isolate("n")
    leader.propose(b"x")
    g.flush()
    assert leader.propose_conf_change(ConfChange(ConfOp.PROMOTE, "n")) is None
    g.heal()
    g.tick(2)
    assert leader.propose_conf_change(ConfChange(ConfOp.PROMOTE, "n")) is not None
    g.flush()
    assert "n" in g.nodes["b"].voters()


def test_a_log_entry_of_an_earlier_term_commits_only_with_one_of_the_current_term() -> None:
    g = Group()
    leader = g.elect("a")
    # A new leader's first entry is its no-op; nothing is read before it commits.
    assert leader.log.entries[-1] == Entry(leader.log.last_index(), leader.term, b"")


def _quiet_group() -> Group:
    g = Group(config=RaftConfig(election_ticks=10, heartbeat_ticks=1, quiesce_after_ticks=5))
    leader = g.elect("a")
    leader.propose(b"x")
    g.tick(10)
    return g


def test_an_idle_group_goes_quiet_and_a_proposal_wakes_it() -> None:
    g = _quiet_group()
    assert all(n.quiesced for n in g.nodes.values())
    # Quiet only once every replica knows the commit (no append will bring it later).
    assert {n.log.commit for n in g.nodes.values()} == {g.nodes["a"].log.last_index()}
    for node in g.nodes.values():
        for _ in range(50):
            node.tick()
        assert not node.has_ready()  # no heartbeats, no elections: nothing to send
    g.nodes["a"].propose(b"y")
    g.flush()
    assert g.payloads("c")[-1] == b"y"
    assert not any(n.quiesced for n in g.nodes.values())


def test_a_read_wakes_a_quiet_group_for_its_round_only() -> None:
    """A read leaves nothing for a follower to catch up on: once its round is answered the
    group is quiet again on the leader's next heartbeat, not after another idle spell (a
    receive's look at an idle partition every few hundred ms kept its group heartbeating)."""
    g = _quiet_group()
    leader = g.nodes["a"]
    served: list[bytes] = []
    ready = leader.ready

    def recorded() -> object:
        rd = ready()
        served.extend(rs.context for rs in rd.read_states)
        return rd

    leader.ready = recorded  # type: ignore[method-assign]
    assert leader.read_index(b"r")
    g.flush()
    assert served == [b"r"]
    assert not any(n.quiesced for n in g.nodes.values())  # the read's round woke them
    g.tick()
    assert all(n.quiesced for n in g.nodes.values())
    leader.propose(b"y")  # work still wakes it for a whole idle spell
    g.tick(4)
    assert not any(n.quiesced for n in g.nodes.values())


def test_a_group_with_rare_heartbeats_goes_quiet_knowing_the_commit() -> None:
    g = Group(config=RaftConfig(election_ticks=10, heartbeat_ticks=3, quiesce_after_ticks=9))
    leader = g.elect("a")
    for i in range(3):
        leader.propose(b"x%d" % i)
        g.flush()
    g.tick(30)
    assert all(n.quiesced for n in g.nodes.values())
    assert {n.log.commit for n in g.nodes.values()} == {leader.log.last_index()}
    assert g.payloads("b") == g.payloads("c") == [b"x0", b"x1", b"x2"]


def test_a_quiet_follower_woken_by_its_host_replaces_a_dead_leader() -> None:
    g = _quiet_group()
    g.isolate("a")  # the leader's node is gone; only the host's liveness can tell
    g.tick(100, only=["b", "c"])
    assert not g.nodes["b"].is_leader() and not g.nodes["c"].is_leader()
    for n in ("b", "c"):
        g.nodes[n].wake()
    g.tick(60, only=["b", "c"])
    assert g.nodes["b"].is_leader() or g.nodes["c"].is_leader()


def _dead_leader_replaced(told: tuple[str, ...]) -> tuple[RaftNode | None, int]:
    """Kill a's process (nothing reaches it any more), tell ``told`` that its node refused a
    connection, and tick b and c for a fifth of an election timeout: the new leader, if any,
    and a's term."""
    g = Group(config=RaftConfig(election_ticks=20, heartbeat_ticks=1))
    leader = g.elect("a")
    g.tick(3)
    term = leader.term
    g.isolate("a")
    for n in told:
        g.nodes[n].forget_leader()
    g.tick(4, only=["b", "c"])
    new = g.leader()
    return (new if new is not leader else None), term


def test_followers_told_their_leaders_node_is_gone_elect_another_within_a_few_ticks() -> None:
    new, term = _dead_leader_replaced(("b", "c"))
    assert new is not None and new.id in ("b", "c") and new.term == term + 1


def test_without_being_told_followers_wait_out_their_election_timeout() -> None:
    """The test above without the host's word: four ticks are far from a timeout."""
    new, _ = _dead_leader_replaced(())
    assert new is None


def test_a_follower_that_forgets_a_live_leader_cannot_depose_it() -> None:
    """A refusal that was not a death (a restarting listener, a wrong address): the other
    follower still heard the leader within its lease and refuses the pre-vote, so the
    leader keeps its term."""
    g = Group(config=RaftConfig(election_ticks=20, heartbeat_ticks=1))
    leader = g.elect("a")
    term = leader.term
    g.nodes["b"].forget_leader()
    g.tick(30)
    assert g.leader() is leader and leader.term == term
    assert g.nodes["b"].lead == "a"  # the next heartbeat named the leader again


def test_only_a_follower_with_a_leader_forgets_it() -> None:
    g = Group(config=RaftConfig(election_ticks=20, heartbeat_ticks=1))
    leader = g.elect("a")
    leader.forget_leader()
    assert leader.is_leader() and leader.lead == "a"
    g.isolate("b")
    g.tick(45, only=["b"])  # past any timeout: b stands, and no one answers
    candidate = g.nodes["b"]
    role, elapsed = candidate.role, candidate.election_elapsed
    assert role is Role.PRE_CANDIDATE
    candidate.forget_leader()
    assert (candidate.role, candidate.election_elapsed) == (role, elapsed)


def test_a_wiped_replica_casts_no_vote_in_the_first_term_it_learns_of() -> None:
    """It may have voted in that term before it lost its disk."""
    import random

    from sqsq.raft import HardState, RaftNode, SnapshotMeta

    g = Group()
    g.elect("a")
    wiped = RaftNode("c", hard_state=HardState(), snapshot=SnapshotMeta(0, 0, g.conf),
                     rng=random.Random(1), wiped=True)
    term = g.nodes["a"].term + 1
    wiped.step(Message(MsgType.VOTE, "c", "b", term, log_term=term - 1, index=10))
    assert [m.reject for m in wiped.ready().messages] == [True]
    wiped.step(Message(MsgType.VOTE, "c", "b", term + 1, log_term=term - 1, index=10))
    assert [m.reject for m in wiped.ready().messages] == [False]  # a later term: it votes
