"""The etcd store beyond the contract suite: its URL, members lost and paused, quorum, restores."""

from __future__ import annotations

import threading
import time

import pytest

from celery_leader.exceptions import ConfigurationError, StoreAuthError, StoreError
from celery_leader.stores import Holder, open_store
from celery_leader.stores.etcd_gateway import EtcdURL
from harness.servers import EtcdCluster


def holder(tag: str) -> Holder:
    return Holder(f"id-{tag}", f"node-{tag}", "h", 1)


def test_the_url_lists_every_member_with_a_prefix_and_tls_files():
    target = EtcdURL.parse("etcds://u:p%40ss@a:2379,b:2380,[::1]:2381/jobs/main?cacert=/ca.pem")
    assert target.endpoints == ["https://a:2379", "https://b:2380", "https://[::1]:2381"]
    assert (target.prefix, target.user, target.password) == ("jobs/main", "u", "p@ss")
    assert target.tls == {"cacert": "/ca.pem"}
    assert EtcdURL.parse("etcd://h:2379").prefix == "celery-leader"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("etcd:///prefix", "name at least one etcd member"),
        ("etcd://h/prefix", "each etcd member is host:port"),
        ("etcd://h:1/p?cacert=/ca.pem", "need etcds://"),
        ("etcds://h:1/p?cert=/c.pem", "needs both cert and key"),
        ("etcd://h:1/p?timeout=3", "unknown query key 'timeout'"),
    ],
)
def test_a_bad_url_names_the_setting_and_the_form(url, why):
    with pytest.raises(ConfigurationError, match="leader_backend_url") as caught:
        open_store(url, timeout=1)
    assert why in str(caught.value)


@pytest.mark.parametrize("url", ["etcd://root:pa?ss=wd@h1:2379/p", "etcd://root:pa/ss@h1/p"])
def test_a_password_with_url_characters_never_shows(url):
    """A password holding "?" or "/" stays out of errors and of the parsed URL's repr."""
    try:
        target = EtcdURL.parse(url)
    except ConfigurationError as exc:
        text = str(exc)
    else:
        text = repr(target)
        assert target.password is not None and target.password.startswith("pa")
    assert "ss=wd" not in text and "pa/ss" not in text and "pa?" not in text


def test_the_password_is_masked_in_the_url_and_in_errors():
    """Nothing listens on port 9: the error names the store without its password."""
    store = open_store("etcd://root:hunter22@127.0.0.1:9/p", timeout=1)
    assert "hunter22" not in store.url and "root:***@" in store.url
    with pytest.raises(StoreError) as caught:
        store.read("job")
    assert "hunter22" not in str(caught.value)


@pytest.fixture
def one(tmp_path):
    cluster = EtcdCluster(tmp_path, size=1).start()
    yield cluster
    cluster.close()


@pytest.fixture
def three(tmp_path):
    cluster = EtcdCluster(tmp_path, size=3).start()
    yield cluster
    cluster.close()


def test_a_user_and_password_log_in_and_a_wrong_password_is_an_auth_error(one):
    """etcd with auth on: the store logs in with the URL's user; a wrong password says so."""
    for args in (["user", "add", "root:s3cret-pw"], ["auth", "enable"]):
        proc = one.etcdctl(*args)
        assert proc.returncode == 0, proc.stderr
    good = open_store(one.url.replace("etcd://", "etcd://root:s3cret-pw@"), timeout=2)
    result = good.acquire("job", holder("a"), 3)
    assert result.acquired and good.renew("job", "id-a", 3) and good.release("job", "id-a")
    bad = open_store(one.url.replace("etcd://", "etcd://root:wrong-pw@"), timeout=2)
    with pytest.raises(StoreAuthError) as caught:
        bad.read("job")
    assert "wrong-pw" not in str(caught.value) and "s3cret" not in str(caught.value)
    anonymous = open_store(one.url, timeout=2)
    with pytest.raises(StoreAuthError):
        anonymous.read("job")


def test_the_ttl_is_rounded_up_to_whole_seconds_never_down(one):
    """A 1.2 s lease is a 2 s etcd lease: the server keeps it at least as long as the holder."""
    store = open_store(one.url, timeout=2)
    assert store.acquire("job", holder("a"), 1.2).acquired
    time.sleep(1.4)  # past the holder's own ttl: etcd still has it
    record = store.read("job")
    assert record is not None and record.nodename == "node-a"
    time.sleep(1.5)
    assert store.read("job") is None


def test_losing_the_leader_member_keeps_the_lease_and_the_watch(three):
    """Kill etcd's leader member: the holder renews through the others and a follower's
    watch (resumed on another member) still hears the release."""
    store = open_store(three.url, timeout=2)
    first = store.acquire("job", holder("a"), 3)
    assert first.acquired
    heard = threading.Event()
    watch = open_store(three.url, timeout=2).watch("job", heard.set)
    try:
        assert heard.wait(5)  # the call back once it is up
        heard.clear()
        three.wait_leader().kill()
        deadline = time.monotonic() + 15
        renewed = False
        while time.monotonic() < deadline and not renewed:
            try:
                renewed = store.renew("job", "id-a", 3)
            except StoreError:
                time.sleep(0.2)
        assert renewed, "no renewal through the two members left"
        assert store.release("job", "id-a")
        assert heard.wait(10), "the release was not heard after the member's loss"
        second = open_store(three.url, timeout=2).acquire("job", holder("b"), 3)
        assert second.acquired and second.hold_off == 0
        assert second.token is not None and first.token is not None
        assert second.token > first.token
    finally:
        watch.close()


def test_without_quorum_nobody_holds_and_with_it_back_tokens_rise(three):
    """Two of three members down: renewals fail (the holder will declare loss), no acquire
    succeeds; both back: one holder again, with a greater token."""
    store = open_store(three.url, timeout=1)
    first = store.acquire("job", holder("a"), 3)
    assert first.acquired
    leader = three.wait_leader()
    leader.kill()
    other = next(m for m in three.members if m is not leader)
    other.kill()
    with pytest.raises(StoreError):
        store.renew("job", "id-a", 3)
    with pytest.raises(StoreError):
        open_store(three.url, timeout=1).acquire("job", holder("b"), 3)
    leader.restart()
    other.restart()
    three.wait_leader(timeout=20)
    deadline = time.monotonic() + 20
    result = None
    while time.monotonic() < deadline:
        try:
            result = open_store(three.url, timeout=2).acquire("job", holder("b"), 3)
        except StoreError:
            time.sleep(0.2)
            continue
        if result.acquired:
            break
        time.sleep(0.2)
    assert result is not None and result.acquired, result
    assert result.token is not None and first.token is not None and result.token > first.token


def test_a_paused_member_ends_a_call_at_its_deadline_and_the_next_one_answers(three):
    """SIGSTOP the member the store talks to: the call returns within its timeout (on the
    next member) and the lease keeps being renewed."""
    store = open_store(three.url, timeout=1.5)
    assert store.acquire("job", holder("a"), 3).acquired
    three.members[0].pause()
    try:
        started = time.monotonic()
        try:
            renewed = store.renew("job", "id-a", 3)
        except StoreError:
            renewed = store.renew("job", "id-a", 3)
        took = time.monotonic() - started
        assert renewed
        assert took < 4, f"a renewal took {took:.1f} s with one member paused"
    finally:
        three.members[0].resume()


def test_data_that_went_back_holds_the_next_holder_off(one):
    """The store emptied under a running process (a restore to a new cluster): the process
    sees the revision go back, and the next acquire holds off one ttl, tokens still rising."""
    store = open_store(one.url, timeout=2)
    first = store.acquire("job", holder("a"), 3)
    assert first.acquired
    for i in range(5):
        assert store.set_state("job", "id-a", f"k{i}", "v")
    assert store.release("job", "id-a")
    time.sleep(1.1)
    one.restart_empty()
    again = store.acquire("job", holder("b"), 3)
    assert again.acquired and again.hold_off == pytest.approx(3, abs=0.01)
    assert again.token is not None and first.token is not None and again.token > first.token


def test_a_snapshot_restored_under_running_workers_holds_the_next_holder_off(one, tmp_path):
    """etcd restored from an older snapshot (same cluster id): the term record of a later
    term is gone. A process that saw the later revision holds the next holder off one ttl,
    and the token still rises above the forgotten term's."""
    import shutil

    store = open_store(one.url, timeout=2)
    assert store.acquire("job", holder("a"), 3).acquired
    assert store.release("job", "id-a")
    snapshot = tmp_path / "snap.db"
    saved = one.etcdctl("snapshot", "save", str(snapshot))
    assert saved.returncode == 0, saved.stderr
    later = store.acquire("job", holder("b"), 3)  # the term the restore forgets
    assert later.acquired
    for i in range(5):
        assert store.set_state("job", "id-b", f"k{i}", "v")
    member = one.members[0]
    member.kill()
    shutil.rmtree(member.data_dir)
    restored = one.etcdctl(
        "snapshot",
        "restore",
        str(snapshot),
        "--name",
        member.name,
        "--data-dir",
        str(member.data_dir),
        "--initial-cluster",
        member.initial_cluster,
        "--initial-cluster-token",
        member.cluster_token,
        "--initial-advertise-peer-urls",
        member.peer_url,
    )
    assert restored.returncode == 0, restored.stderr
    time.sleep(1.1)  # the stated assumption: not within a second of the last grant
    member.restart()
    assert store.read("job") is None, "the restored data has no lease"
    after = store.acquire("job", holder("c"), 3)
    assert after.acquired
    assert after.hold_off == pytest.approx(3, abs=0.01), "no hold-off after a restore"
    assert after.token is not None and later.token is not None and after.token > later.token


def test_etcds_with_a_ca_and_a_client_certificate(tmp_path):
    """etcds:// with cacert, cert and key in the query: the lease works over TLS with client
    certificate auth; without the client certificate the member refuses the store."""
    import trustme

    from harness.servers import EtcdMember

    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("celery-leader-client")
    files = {
        name: tmp_path / f"{name}.pem"
        for name in ("ca", "server-cert", "server-key", "client-cert", "client-key")
    }
    ca.cert_pem.write_to_path(files["ca"])
    server_cert.cert_chain_pems[0].write_to_path(files["server-cert"])
    server_cert.private_key_pem.write_to_path(files["server-key"])
    client_cert.cert_chain_pems[0].write_to_path(files["client-cert"])
    client_cert.private_key_pem.write_to_path(files["client-key"])
    member = EtcdMember(tmp_path / "etcd")
    https = f"https://127.0.0.1:{member.client_port}"
    member.extra = [
        "--listen-client-urls", https,
        "--advertise-client-urls", https,
        "--cert-file", str(files["server-cert"]),
        "--key-file", str(files["server-key"]),
        "--trusted-ca-file", str(files["ca"]),
        "--client-cert-auth",
    ]  # fmt: skip
    member.start(wait=False)
    try:
        base = f"etcds://127.0.0.1:{member.client_port}/tls?cacert={files['ca']}"
        url = f"{base}&cert={files['client-cert']}&key={files['client-key']}"
        deadline = time.monotonic() + 15
        while True:
            try:
                result = open_store(url, timeout=2).acquire("job", holder("a"), 3)
                break
            except StoreError:
                assert time.monotonic() < deadline, "etcd never served over TLS"
                time.sleep(0.2)
        store = open_store(url, timeout=2)
        assert result.acquired and store.renew("job", "id-a", 3)
        record = store.read("job")
        assert record is not None and record.nodename == "node-a"
        assert store.release("job", "id-a")
        with pytest.raises(StoreError):
            open_store(base, timeout=2).read("job")  # no client certificate
    finally:
        member.kill()
        member.remove_data()


def restore(cluster, snapshot) -> None:  # type: ignore[no-untyped-def]
    """Kill the one member, put *snapshot* in place of its data (same cluster id), restart."""
    import shutil

    member = cluster.members[0]
    member.kill()
    shutil.rmtree(member.data_dir)
    restored = cluster.etcdctl(
        "snapshot", "restore", str(snapshot),
        "--name", member.name,
        "--data-dir", str(member.data_dir),
        "--initial-cluster", member.initial_cluster,
        "--initial-cluster-token", member.cluster_token,
        "--initial-advertise-peer-urls", member.peer_url,
    )  # fmt: skip
    assert restored.returncode == 0, restored.stderr
    member.restart()


def test_a_follower_that_only_watched_notices_a_restore_behind_a_term_it_saw_begin(one, tmp_path):
    """This process only watches while another process's term begins; etcd is then restored
    to a snapshot from before that term. This process's next acquire holds off one ttl:
    its watch saw the lost term's revision (it made no call of its own since)."""
    import subprocess
    import sys

    store = open_store(one.url, timeout=2)
    assert store.acquire("job", holder("a"), 3).acquired
    assert store.release("job", "id-a")
    heard = threading.Event()
    watch = store.watch("job", heard.set)
    try:
        snapshot = tmp_path / "snap.db"
        assert one.etcdctl("snapshot", "save", str(snapshot)).returncode == 0
        for i in range(3):  # revisions beyond the snapshot's, seen by no call of this process
            assert one.etcdctl("put", f"other/{i}", "x").returncode == 0
        code = (
            "from celery_leader.stores import open_store\n"
            "from celery_leader.stores.base import Holder\n"
            f"store = open_store({one.url!r}, timeout=2)\n"
            "assert store.acquire('job', Holder('id-b', 'node-b', 'h', 2), 3).acquired\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
        # The watch event of that term's beginning (no call of this process may see it),
        # and the stated assumption: no restore within a second of the last grant.
        time.sleep(1.6)
        restore(one, snapshot)
        after = store.acquire("job", holder("c"), 3)
        assert after.acquired
        assert after.hold_off == pytest.approx(3, abs=0.01), "the restore went unnoticed"
    finally:
        watch.close()


def test_a_key_deleted_by_hand_late_in_a_long_term_holds_the_next_holder_off(one):
    """The term's earliest end moves with each renewal: a lease key deleted by hand after
    the first ttl still holds the next holder off one ttl (the old one may trust it)."""
    store = open_store(one.url, timeout=2)
    assert store.acquire("job", holder("a"), 2).acquired
    for _ in range(3):  # past the first ttl, renewing
        time.sleep(0.8)
        assert store.renew("job", "id-a", 2)
    deleted = one.etcdctl("del", "celery-leader-test/lease/job")
    assert deleted.returncode == 0 and deleted.stdout.strip() == "1", deleted.stdout
    after = open_store(one.url, timeout=2).acquire("job", holder("b"), 2)
    assert after.acquired and after.hold_off == pytest.approx(2, abs=0.01)
