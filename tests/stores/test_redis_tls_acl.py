"""Redis store over TLS with an ACL user: works, and a wrong password stays secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from celery_leader.exceptions import StoreAuthError, StoreError
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import RedisServer


@pytest.fixture
def tls_server(tmp_path: Path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem"}
    ca.cert_pem.write_to_path(paths["ca"])
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    server = RedisServer(tmp_path, tls={k: str(v) for k, v in paths.items()}).start()
    admin = server.client(ssl=True, ssl_ca_certs=str(paths["ca"]))
    admin.execute_command("ACL", "SETUSER", "leader", "on", ">s3cr3t-pass", "~*", "&*", "+@all")
    admin.close()
    yield server, paths["ca"]
    server.stop()


def test_rediss_with_acl_user_runs_the_lease(tls_server):
    """rediss://user:pass@... with the CA in the URL: acquire, renew, read, release."""
    server, ca = tls_server
    url = f"rediss://leader:s3cr3t-pass@127.0.0.1:{server.port}/0?ssl_ca_certs={ca}"
    store = open_store(url, timeout=1.0)
    try:
        holder = Holder.for_this_process("tls-node")
        result = store.acquire("job", holder, 5.0)
        assert result.acquired
        assert store.renew("job", holder.lease_id, 5.0)
        assert store.read("job").nodename == "tls-node"
        assert store.release("job", holder.lease_id)
        assert "s3cr3t-pass" not in store.url and "leader:***@" in store.url
    finally:
        store.close()


def test_wrong_password_is_clear_and_masked(tls_server):
    """A wrong ACL password raises StoreAuthError; neither password appears."""
    server, ca = tls_server
    url = f"rediss://leader:not-the-pass@127.0.0.1:{server.port}/0?ssl_ca_certs={ca}"
    store = open_store(url, timeout=1.0)
    try:
        with pytest.raises(StoreAuthError) as info:
            store.acquire("job", Holder.for_this_process(), 5.0)
        message = str(info.value)
        assert "not-the-pass" not in message and "s3cr3t-pass" not in message
        assert f"127.0.0.1:{server.port}" in message
        assert "acquire failed" in message
    finally:
        store.close()


def test_plain_client_is_refused_by_tls_port(tls_server):
    """redis:// against a TLS-only port fails as a store error, not a hang or crash."""
    server, _ = tls_server
    store = open_store(f"redis://leader:s3cr3t-pass@127.0.0.1:{server.port}/0", timeout=1.0)
    try:
        with pytest.raises(StoreError, match="lease store"):
            store.read("job")
    finally:
        store.close()


def test_unix_socket_url_runs_the_lease(tmp_path):
    """unix:///path.sock?db=N reaches a redis-server over its Unix socket."""
    sock = tmp_path / "redis.sock"
    server = RedisServer(tmp_path, extra=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    server.start()
    store = open_store(f"unix://{sock}?db=3", timeout=1.0)
    try:
        holder = Holder.for_this_process("unix-node")
        assert store.acquire("job", holder, 5.0).acquired
        assert server.client(db=3).exists("celery-leader:{job}:lease") == 1
        assert store.release("job", holder.lease_id)
    finally:
        store.close()
        server.stop()
