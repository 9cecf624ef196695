"""Beat in single-active-scheduler mode: real ``celery beat`` processes and a real worker."""

from __future__ import annotations

import itertools
import signal
import time

import pytest


def gaps(sends):
    return [b["at"] - a["at"] for a, b in itertools.pairwise(sends)]


def wait_sending(cluster, beats, timeout=10.0, exclude=None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for beat in beats:
            if beat is not exclude and beat.proc.poll() is None and beat.sends_now():
                return beat
        time.sleep(0.05)
    raise AssertionError("no beat took the lead")


@pytest.fixture
def beat_cluster(cluster_for):
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.start(1)
    return cluster


@pytest.mark.slow
def test_three_beats_send_each_slot_once(beat_cluster):
    """3 beats, an entry every second, 20 s: one send per slot, all from one term."""
    cluster = beat_cluster
    beats = [cluster.start_beat() for _ in range(3)]
    wait_sending(cluster, beats)
    cluster.history_client.delete("history")
    time.sleep(20)
    sends = cluster.beat_sends()
    assert 18 <= len(sends) <= 21, len(sends)
    assert min(gaps(sends)) > 0.8, gaps(sends)
    assert len({s["token"] for s in sends}) == 1 and sends[0]["token"] > 0
    assert sum(b.sends_now() for b in beats) == 1
    code, status = cluster.leader_status()
    assert code == 0, "a worker leads too"
    assert status["beat"]["token"] == sends[0]["token"]
    assert status["beat"]["nodename"].startswith("beat-")


@pytest.mark.compat
@pytest.mark.slow
def test_sigkill_sending_beat_fails_over_without_double_sends(beat_cluster):
    """SIGKILL the sending beat: another sends within ttl + 2 s; no slot sent twice."""
    cluster = beat_cluster
    beats = [cluster.start_beat() for _ in range(2)]
    old = wait_sending(cluster, beats)
    time.sleep(3)
    killed_at = time.monotonic()
    old.signal(signal.SIGKILL)
    new = wait_sending(cluster, beats, timeout=2 + 5, exclude=old)
    time.sleep(4)
    sends = cluster.beat_sends()
    after = [s for s in sends if s["at"] > killed_at]
    before = [s for s in sends if s["at"] <= killed_at]
    assert after, "the standby sends after the kill"
    assert after[0]["at"] - killed_at < 2 + 2
    assert min(s["token"] for s in after) > max(s["token"] for s in before)
    assert min(gaps(sends)) > 0.5, "no slot sent twice across the failover"
    assert new is not old


def test_sigterm_sending_beat_hands_over_within_two_seconds(beat_cluster):
    """SIGTERM the sending beat: it releases; the standby's first send follows within 2 s."""
    cluster = beat_cluster
    beats = [cluster.start_beat() for _ in range(2)]
    old = wait_sending(cluster, beats)
    time.sleep(2)
    stopped_at = time.monotonic()
    old.proc.send_signal(signal.SIGTERM)
    wait_sending(cluster, beats, timeout=5, exclude=old)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        after = [s for s in cluster.beat_sends() if s["at"] > stopped_at]
        if len({s["token"] for s in after}) >= 1 and any(
            s["token"] != cluster.beat_sends()[0]["token"] for s in after
        ):
            break
        time.sleep(0.05)
    sends = cluster.beat_sends()
    first_token = sends[0]["token"]
    new_sends = [s for s in sends if s["token"] != first_token]
    assert new_sends, "the standby sends"
    assert new_sends[0]["at"] - stopped_at < 2.0
    assert min(gaps(sends)) > 0.5
    assert "released election" in old.text()


@pytest.mark.slow
def test_embedded_beat_on_three_workers_one_sends(cluster_for):
    """`worker -B` on 3 workers: exactly one embedded beat sends, once per slot."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    workers = [
        cluster.start(1, extra=["-B", "-s", str(cluster.tmp / f"wb{i}-schedule")])[0]
        for i in range(3)
    ]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not cluster.beat_sends():
        time.sleep(0.1)
    cluster.history_client.delete("history")
    time.sleep(8)
    sends = cluster.beat_sends()
    assert 6 <= len(sends) <= 9, len(sends)
    assert min(gaps(sends)) > 0.8
    assert len({s["token"] for s in sends}) == 1
    assert sum("this beat sends now" in w.text() for w in workers) == 1


@pytest.mark.slow
def test_redbeat_is_really_used_and_led(cluster_for):
    """Wrapping RedBeat: its schedule lives in Redis, its lock is off, one beat sends."""
    cluster = cluster_for("redis")
    cluster.env.update(
        {
            "LEADER_BEAT_EVERY": "1",
            "LEADER_BEAT_WRAPPED": "redbeat.RedBeatScheduler",
            "LEADER_BEAT_REDIS": f"redis://127.0.0.1:{cluster.data.port}/3",
        }
    )
    cluster.start(1)
    beats = [cluster.start_beat() for _ in range(2)]
    old = wait_sending(cluster, beats)
    cluster.history_client.delete("history")
    time.sleep(5)
    sends = cluster.beat_sends()
    assert 4 <= len(sends) <= 6 and min(gaps(sends)) > 0.8
    redbeat = cluster.data.client(db=3)
    keys = redbeat.keys(f"redbeat-{cluster.name}*")
    assert f"redbeat-{cluster.name}:tick" in keys, keys
    assert not redbeat.exists(f"redbeat-{cluster.name}::lock")
    assert "standby mode idle" in old.text()
    killed_at = time.monotonic()
    old.signal(signal.SIGKILL)
    wait_sending(cluster, beats, timeout=2 + 5, exclude=old)
    time.sleep(2)
    after = [s for s in cluster.beat_sends() if s["at"] > killed_at]
    assert after and after[0]["at"] - killed_at < 2 + 2
    assert min(gaps(cluster.beat_sends())) > 0.5


@pytest.mark.slow
def test_beat_that_cannot_publish_hands_over(cluster_for, tmp_path):
    """The sending beat's broker dies while the store is fine: another beat sends."""
    from harness.servers import RedisServer

    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.start(1)  # runs beat_tick from the cluster's broker
    lonely = RedisServer(tmp_path).start()
    try:
        own = cluster.env["LEADER_BROKER"]
        cluster.env["LEADER_BROKER"] = lonely.url
        try:
            first = cluster.start_beat()
        finally:
            cluster.env["LEADER_BROKER"] = own
        wait_sending(cluster, [first])
        second = cluster.start_beat()
        time.sleep(2)
        assert not second.sends_now()
        lonely.stop()
        broken_at = time.monotonic()
        rows = cluster.wait_history(lambda r: any(x["kind"] == "beat" for x in r), 30)
    finally:
        lonely.stop()
    sends = [r for r in rows if r["kind"] == "beat"]
    assert sends, "the beat whose broker works took over"
    assert sends[0]["at"] - broken_at < 15
    assert "released election" in first.text() or "lost the lead" in first.text()
