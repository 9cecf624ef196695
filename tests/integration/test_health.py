"""One health story: a real worker and a real beat answer /healthz with the same fields.

The worker takes part in two elections (``tests.integration.electionsapp``:
the default one and "billing"); beat in its own. Each process reports every
election it takes part in, each with the same fields, and the token each
reports is the one the lease store holds.
"""

from __future__ import annotations

from celery_leader.stores import open_store
from harness.servers import free_port
from tests.integration.test_metrics_worker import health, wait_for

APP = "tests.integration.electionsapp"
#: The fields of one election in every answer, on a worker and on a beat.
ELECTION_FIELDS = {"state", "role", "store_failures", "token", "expires_in"}
#: The top-level fields of a healthy answer (earlier releases' among them).
TOP_FIELDS = {"healthy", "status", "election", "role", "loop_age", "store_failures", "elections"}


def store_token(cluster, lease: str) -> int | None:  # type: ignore[no-untyped-def]
    """The token of *lease*'s holder as the store has it (None: nobody holds it)."""
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        record = store.read(lease)
    finally:
        store.close()
    return None if record is None else record.token


def leading(port: int, elections: set[str]):  # type: ignore[no-untyped-def]
    """The 200 answer of *port* once every one of *elections* leads there, else None."""
    try:
        code, body = health(port)
    except OSError:
        return None  # not serving yet
    views = body.get("elections", {})
    if code == 200 and all(views.get(e, {}).get("state") == "leading" for e in elections):
        return body
    return None


def test_a_worker_in_two_elections_and_a_beat_report_every_election_with_the_same_fields(
    cluster_for,
):
    """The worker's /healthz lists both of its elections, beat's its own; per election the
    same fields (state, role, store_failures, token, expires_in), and so at the top; each
    token is the lease's token in the store, each expires_in within one ttl."""
    cluster = cluster_for("redis")
    ttl = float(cluster.env["LEADER_TTL"])
    default, billing, beat = cluster.name, f"{cluster.name}.billing", f"{cluster.name}.beat"
    worker_port, beat_port = free_port(), free_port()
    cluster.start(
        1,
        app=APP,
        env={"LEADER_EXCLUDE": "reports", "CELERY_LEADER_METRICS_PORT": str(worker_port)},
    )
    cluster.env.update(
        {"LEADER_BEAT_EVERY": "1", "CELERY_LEADER_BEAT_METRICS_PORT": str(beat_port)}
    )
    cluster.start_beat(app=APP)

    on_worker = wait_for(lambda: leading(worker_port, {default, billing}), 20, "both lead")
    on_beat = wait_for(lambda: leading(beat_port, {beat}), 20, "beat leads")

    assert set(on_worker["elections"]) == {default, billing}, on_worker
    assert set(on_beat["elections"]) == {beat}, on_beat
    assert set(on_worker) == set(on_beat) == TOP_FIELDS
    assert (on_worker["election"], on_beat["election"]) == (default, beat)
    views = {**on_worker["elections"], **on_beat["elections"]}
    for lease, view in views.items():
        assert set(view) == ELECTION_FIELDS, (lease, view)
        assert (view["state"], view["role"], view["store_failures"]) == ("leading", "leader", 0)
        assert 0 < view["expires_in"] <= ttl, (lease, view)
        assert view["token"] == store_token(cluster, lease), (lease, view)
    assert on_worker["status"] == on_beat["status"] == "ok"


def test_a_beat_standby_reports_its_election_as_a_follower_with_no_token(cluster_for):
    """Two beats: the standby answers 200 "ok", its election following, token and
    expires_in null, with the same fields as the leader's answer."""
    cluster = cluster_for("redis")
    beat = f"{cluster.name}.beat"
    ports = [free_port(), free_port()]
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    for port in ports:
        cluster.env["CELERY_LEADER_BEAT_METRICS_PORT"] = str(port)
        cluster.start_beat()

    def answers():  # type: ignore[no-untyped-def]
        try:
            found = [health(port) for port in ports]
        except OSError:
            return None
        states = sorted(body["elections"][beat]["state"] for _, body in found)
        return found if states == ["following", "leading"] else None

    found = wait_for(answers, 20, "one beat leads, the other follows")
    (standby,) = [body for _, body in found if body["role"] == "follower"]
    (leader,) = [body for _, body in found if body["role"] == "leader"]
    assert [code for code, _ in found] == [200, 200]
    assert standby["status"] == "ok", standby
    assert standby["elections"][beat] == {
        "state": "following",
        "role": "follower",
        "store_failures": 0,
        "token": None,
        "expires_in": None,
    }
    assert set(standby) == set(leader)
    assert leader["elections"][beat]["token"] == store_token(cluster, beat)
