"""harness.servers.EtcdCluster: real etcd members that elect, fail over, rejoin and lose data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.servers import EtcdCluster, EtcdMember


@pytest.fixture
def etcd1(tmp_path: Path) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path, 1) as cluster:
        yield cluster.start()
    assert not any(m.running for m in cluster.members)


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path, 3) as cluster:
        yield cluster.start()
    assert not any(m.running for m in cluster.members)


def put(cluster: EtcdCluster, key: str, value: str) -> None:
    done = cluster.etcdctl("put", key, value)
    assert done.returncode == 0, done.stderr


def get(cluster: EtcdCluster, key: str) -> str:
    done = cluster.etcdctl("get", "--print-value-only", key)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def member_ids(cluster: EtcdCluster) -> set[str]:
    done = cluster.etcdctl("member", "list")
    assert done.returncode == 0, done.stderr
    return {line.split(",")[0] for line in done.stdout.splitlines()}


def test_one_member_serves_put_and_get(etcd1: EtcdCluster) -> None:
    (member,) = etcd1.members
    assert etcd1.url == f"etcd://127.0.0.1:{member.client_port}/celery-leader-test"
    assert member.endpoint == f"127.0.0.1:{member.client_port}"
    assert etcd1.leader() is member

    put(etcd1, "/celery-leader-test/k", "v1")

    assert get(etcd1, "/celery-leader-test/k") == "v1"


def test_a_member_alone_starts_and_restarts_with_its_data(tmp_path: Path) -> None:
    member = EtcdMember(tmp_path)
    try:
        member.start()
        cluster_id = member.status()["header"]["cluster_id"]  # type: ignore[index]
        member.pause()
        assert member.status(timeout=0.3) is None, "a paused member answered"
        member.resume()
        member.restart()
        assert member.status()["header"]["cluster_id"] == cluster_id  # type: ignore[index]
    finally:
        member.stop()


def test_three_members_elect_fail_over_and_rejoin(etcd3: EtcdCluster) -> None:
    assert etcd3.url == "etcd://{}/celery-leader-test".format(
        ",".join(f"127.0.0.1:{m.client_port}" for m in etcd3.members)
    )
    leader = etcd3.wait_leader()
    assert etcd3.leader() is leader
    put(etcd3, "k", "before")

    leader.kill()
    killed = time.monotonic()
    new_leader = etcd3.wait_leader(5)
    took = time.monotonic() - killed

    assert new_leader is not leader and new_leader.running
    assert took < 5, took
    put(etcd3, "k", "during")  # the two left are a quorum

    leader.restart()  # waits until it serves a linearizable read: it rejoined
    assert etcd3.wait_leader() is new_leader  # the one that comes back does not disrupt it
    assert len(member_ids(etcd3)) == 3
    status = leader.status()
    assert status is not None and int(status["leader"]) != 0
    assert get(etcd3, "k") == "during"


def test_restart_empty_leaves_no_keys(etcd1: EtcdCluster) -> None:
    put(etcd1, "k", "v")
    before = etcd1.members[0].status()

    etcd1.restart_empty()

    assert get(etcd1, "k") == ""
    assert etcd1.etcdctl("get", "--prefix", "").stdout == ""
    after = etcd1.members[0].status()
    assert before is not None and after is not None
    assert after["header"]["cluster_id"] != before["header"]["cluster_id"]
    assert int(after["header"]["revision"]) < int(before["header"]["revision"])


def test_restart_empty_of_three_members_is_a_new_cluster(etcd3: EtcdCluster) -> None:
    put(etcd3, "k", "v")
    ids = member_ids(etcd3)

    etcd3.restart_empty()

    assert get(etcd3, "k") == ""
    assert member_ids(etcd3).isdisjoint(ids)
