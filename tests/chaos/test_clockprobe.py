"""The clock-forward scenario's probe check, on hand-written observations: a queue whose
timers run at the rate the clock rule allows passes; one whose leader jumped an hour ahead
(messages gone at once, hidden messages back at once) fails on both counts."""

from __future__ import annotations

from typing import Any

from chaos.clockprobe import check

RATE = 1.01
V = 3


def _observed(gone_at_s: float, hidden_s: float, messages: int = 5) -> dict[str, Any]:
    """Message i sent at 10*i s, received every ``hidden_s`` until ``gone_at_s`` of age."""
    sends, seen = {}, {}
    for i in range(messages):
        sent = 100.0 + 10 * i
        sends[f"m{i}"] = [sent - 0.01, sent]
        t, sightings = sent + 0.1, []
        while t - sent < gone_at_s:
            sightings.append([t, t + 0.02])
            t += hidden_s
        seen[f"m{i}"] = sightings
    return {"end": 100.0 + 10 * messages + 80, "visibility_timeout_s": V, "retention_s": 60,
            "sends": sends, "seen": seen}


def test_timers_at_the_allowed_rate_pass() -> None:
    # 1% fast: retention ends at 59.4 s, a hidden message is back after 2.97 s
    assert check(_observed(gone_at_s=59.4, hidden_s=V / RATE + 0.05), RATE) == []


def test_a_leader_an_hour_ahead_is_caught() -> None:
    findings = check(_observed(gone_at_s=2.0, hidden_s=0.5), RATE)
    assert any("gone early" in f for f in findings)
    assert any("received again" in f for f in findings)


def test_a_message_never_received_is_gone_early() -> None:
    observed = _observed(gone_at_s=59.4, hidden_s=V)
    observed["seen"]["m0"] = []
    assert check(observed, RATE) == [
        "m0: gone early, last received at never of age (must still come back at 48.4 s)"]
