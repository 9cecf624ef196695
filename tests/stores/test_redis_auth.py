"""A Redis that wants a password: what the store says when none was given, or a wrong one.

Real redis-servers with ``requirepass`` (and a real sentinel in front of one):
the store's error names ``leader_backend_url`` and says which it is, in words,
never redis-py's ``HELLO must be called with the client already
authenticated...`` or ``invalid username-password pair``, and never the
password given.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_leader.exceptions import StoreAuthError
from celery_leader.stores import open_store
from celery_leader.stores.redis import (
    ERR_AUTH_NEEDED,
    ERR_AUTH_REFUSED,
    ERR_AUTH_UNEXPECTED,
)
from harness.servers import RedisServer, SentinelProcess

PASSWORD = "right-s3cret"
WRONG = "wrong-s3cret"


@pytest.fixture
def locked(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A redis-server that needs PASSWORD."""
    server = RedisServer(tmp_path, extra=["--requirepass", PASSWORD]).start()
    yield server
    server.stop()


def refusal(url: str) -> str:
    """The message of the StoreAuthError a read on *url* raises."""
    store = open_store(url, timeout=2)
    try:
        with pytest.raises(StoreAuthError) as found:
            store.read("job")
    finally:
        store.close()
    message = str(found.value)
    assert "leader_backend_url" in message, message
    assert "HELLO" not in message and "username-password" not in message, message
    assert PASSWORD not in message and WRONG not in message, message
    return message


def test_no_password_given_says_the_server_needs_one(locked: RedisServer) -> None:
    """No password in the URL: "the server needs a password and leader_backend_url gives none"."""
    message = refusal(f"redis://127.0.0.1:{locked.port}/0")
    assert message == (
        f"lease store redis://127.0.0.1:{locked.port}/0: read failed: {ERR_AUTH_NEEDED}"
    )


@pytest.mark.parametrize("userinfo", [f":{WRONG}", f"default:{WRONG}", f"nobody:{PASSWORD}"])
def test_a_wrong_password_or_user_says_it_was_refused(locked: RedisServer, userinfo: str) -> None:
    """A wrong password (or an unknown ACL user): "refused the password in leader_backend_url"."""
    user = userinfo.partition(":")[0]
    message = refusal(f"redis://{userinfo}@127.0.0.1:{locked.port}/0")
    assert message == (
        f"lease store redis://{user}:***@127.0.0.1:{locked.port}/0: read failed: {ERR_AUTH_REFUSED}"
    )


def test_the_right_password_is_let_in(locked: RedisServer) -> None:
    """The control: with the password the server asks for, the store answers."""
    store = open_store(f"redis://:{PASSWORD}@127.0.0.1:{locked.port}/0", timeout=2)
    try:
        assert store.read("job") is None
    finally:
        store.close()


def test_a_password_for_a_server_without_one_says_so(redis_server: RedisServer) -> None:
    """RESP2's AUTH to a server with no password set: the URL's password is the mistake."""
    message = refusal(f"redis://:{WRONG}@127.0.0.1:{redis_server.port}/0?protocol=2")
    assert message.endswith(f"read failed: {ERR_AUTH_UNEXPECTED}"), message


def test_sentinel_primary_without_or_with_a_wrong_password(tmp_path: Path, locked: RedisServer):  # type: ignore[no-untyped-def]
    """The Sentinel store reaches the primary the same way: the same two messages."""
    sentinel = SentinelProcess(tmp_path, locked.port, "main", 1)
    # The sentinel itself must reach the primary, or it would call it down.
    with sentinel.config.open("a") as config:
        config.write(f"sentinel auth-pass main {PASSWORD}\n")
    sentinel.start()
    try:
        where = f"127.0.0.1:{sentinel.port}/0?master_name=main"
        assert refusal(f"sentinel://{where}").endswith(f"read failed: {ERR_AUTH_NEEDED}")
        wrong = refusal(f"sentinel://:{WRONG}@{where}")
        assert wrong.endswith(f"read failed: {ERR_AUTH_REFUSED}"), wrong
        store = open_store(f"sentinel://:{PASSWORD}@{where}", timeout=2)
        try:
            assert store.read("job") is None
        finally:
            store.close()
    finally:
        sentinel.stop()
