"""RedisFence against a real redis-server: stale tokens are refused, exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from celery_leader.exceptions import StaleTokenError
from celery_leader.fencing import KEY_PREFIX, RedisFence
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import RedisServer


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain redis-py client of the test's server (bytes replies, no decoding)."""
    conn = redis.Redis.from_url(redis_server.url)
    yield conn
    conn.close()


@pytest.fixture
def fence(client: redis.Redis) -> RedisFence:
    return RedisFence(client)


def test_admit_accepts_increasing_tokens(fence: RedisFence, client: redis.Redis) -> None:
    """Every token greater than the highest seen is admitted and becomes the highest."""
    assert fence.highest("totals") == 0
    for token in (1, 2, 7, 1000):
        assert fence.admit("totals", token) is True
        assert fence.highest("totals") == token
    assert client.get(f"{KEY_PREFIX}totals") == b"1000"


def test_older_token_is_refused_and_leaves_highest(fence: RedisFence) -> None:
    """A token below the highest seen is refused and does not lower the highest."""
    assert fence.admit("totals", 10)
    assert fence.admit("totals", 9) is False
    assert fence.admit("totals", 1) is False
    assert fence.highest("totals") == 10


def test_equal_token_is_admitted(fence: RedisFence) -> None:
    """The current term may write again: a token equal to the highest is admitted."""
    assert fence.admit("totals", 5)
    assert fence.admit("totals", 5) is True
    assert fence.highest("totals") == 5


def test_resources_are_fenced_independently(fence: RedisFence) -> None:
    """The highest token is kept per resource: a high token on one does not fence another."""
    assert fence.admit("a", 100)
    assert fence.admit("b", 3) is True
    assert fence.highest("a") == 100
    assert fence.highest("b") == 3


def test_set_writes_the_value_only_when_admitted(fence: RedisFence, client: redis.Redis) -> None:
    """set() writes the key with an admitted token and leaves it untouched with a stale one."""
    assert fence.set("totals", "totals:day1", "from-5", token=5) is True
    assert client.get("totals:day1") == b"from-5"
    assert fence.set("totals", "totals:day1", "from-4", token=4) is False
    assert client.get("totals:day1") == b"from-5"
    assert fence.highest("totals") == 5
    assert fence.set("totals", "totals:day1", "from-6", token=6) is True
    assert client.get("totals:day1") == b"from-6"
    assert fence.highest("totals") == 6


def test_set_refused_by_an_earlier_admit(fence: RedisFence, client: redis.Redis) -> None:
    """A token admitted by admit() fences later set() calls with older tokens."""
    assert fence.admit("totals", 8)
    assert fence.set("totals", "totals:day2", "late", token=7) is False
    assert client.exists("totals:day2") == 0


def test_require_raises_stale_token_error_naming_the_resource(fence: RedisFence) -> None:
    """require() passes for a current token and raises StaleTokenError for an older one."""
    fence.require("daily-totals", 3)
    fence.require("daily-totals", 3)
    with pytest.raises(StaleTokenError, match="daily-totals") as info:
        fence.require("daily-totals", 2)
    assert info.value.resource == "daily-totals"
    assert info.value.token == 2
    assert "2" in str(info.value)
    assert fence.highest("daily-totals") == 3


def test_sixteen_digit_tokens_compare_exactly(fence: RedisFence, client: redis.Redis) -> None:
    """Clock-derived 16-digit tokens one apart are told apart (no float rounding)."""
    assert fence.admit("big", 1795312088191252)
    assert fence.admit("big", 1795312088191251) is False
    assert fence.highest("big") == 1795312088191252
    assert client.get(f"{KEY_PREFIX}big") == b"1795312088191252"
    assert fence.set("big", "big:value", "stale", token=1795312088191251) is False
    assert client.exists("big:value") == 0
    assert fence.admit("big", 1795312088191253) is True
    assert fence.highest("big") == 1795312088191253


def test_tokens_of_two_real_terms_fence_the_older(
    fence: RedisFence, redis_server: RedisServer
) -> None:
    """Tokens handed out by the Redis lease store for two terms: the newer fences the older."""
    store = open_store(redis_server.url, timeout=1.0)
    try:
        first = store.acquire("job", Holder("old", "old@h", "h", 1), ttl=5.0)
        assert first.acquired and first.token is not None
        assert store.release("job", "old")
        second = store.acquire("job", Holder("new", "new@h", "h", 2), ttl=5.0)
        assert second.acquired and second.token is not None
    finally:
        store.close()
    assert second.token > first.token
    assert fence.set("report", "report:value", "new", token=second.token) is True
    assert fence.set("report", "report:value", "old", token=first.token) is False
    with pytest.raises(StaleTokenError):
        fence.require("report", first.token)
    assert fence.highest("report") == second.token


def test_tokens_beyond_double_precision_compare_exactly(redis_server):
    """Tokens past 2**53 still compare exactly (string comparison, not Lua doubles)."""
    fence = RedisFence(redis_server.client())
    big = 2**60
    assert fence.admit("huge", big + 1)
    assert not fence.admit("huge", big)
    assert fence.highest("huge") == big + 1


def add_to_total(amount: int, *, before_multi=None):
    """A read-modify-write for RedisFence.transaction: total += amount, pending cleared."""

    def body(pipe):
        total = int(pipe.get("total") or 0)
        if before_multi is not None:
            before_multi()
        pipe.multi()
        pipe.set("total", total + amount)
        pipe.delete("pending")
        return total + amount

    return body


def test_transaction_writes_and_raises_the_fence(fence: RedisFence, client: redis.Redis) -> None:
    """A current token's read-modify-write lands in full and the fence moves to its token."""
    client.set("total", 10)
    client.set("pending", 1)
    assert fence.transaction("totals", 4, add_to_total(5), "total") == 15
    assert client.get("total") == b"15"
    assert client.exists("pending") == 0
    assert fence.highest("totals") == 4


def test_transaction_with_a_stale_token_writes_nothing(
    fence: RedisFence, client: redis.Redis
) -> None:
    """A token older than one admitted raises StaleTokenError before any write."""
    client.set("total", 10)
    client.set("pending", 1)
    assert fence.admit("totals", 9)
    with pytest.raises(StaleTokenError):
        fence.transaction("totals", 8, add_to_total(5), "total")
    assert client.get("total") == b"10"
    assert client.exists("pending") == 1
    assert fence.highest("totals") == 9


@pytest.fixture
def other_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A second connection: another process's writes, racing the one under test."""
    conn = redis.Redis.from_url(redis_server.url)
    yield conn
    conn.close()


def on_first_call(action: Callable[[], object]) -> tuple[Callable[[], None], list[int]]:
    """A hook that runs *action* on its first call only, and the list of its calls."""
    calls: list[int] = []

    def hook() -> None:
        calls.append(1)
        if len(calls) == 1:
            action()

    return hook, calls


def test_transaction_refused_when_a_newer_leader_is_admitted_between_read_and_write(
    fence: RedisFence, client: redis.Redis, other_client: redis.Redis
) -> None:
    """The paused-leader race: token 8 reads, token 9 is admitted, token 8's writes never land."""
    client.set("total", 10)

    def admit_newer_leader() -> None:
        assert RedisFence(other_client).admit("totals", 9)

    newer_leader_admitted, calls = on_first_call(admit_newer_leader)

    with pytest.raises(StaleTokenError):
        fence.transaction("totals", 8, add_to_total(5, before_multi=newer_leader_admitted))
    assert calls == [1], "the change of fence aborted EXEC and the retry saw the newer token"
    assert client.get("total") == b"10"
    assert fence.highest("totals") == 9


def test_transaction_reruns_on_fresh_reads_when_a_watched_key_changes(
    fence: RedisFence, client: redis.Redis, other_client: redis.Redis
) -> None:
    """A concurrent change to a watched key makes the body run again on the new value."""
    client.set("total", 10)
    someone_adds_one, calls = on_first_call(lambda: other_client.incr("total"))

    result = fence.transaction("totals", 3, add_to_total(5, before_multi=someone_adds_one), "total")
    assert len(calls) == 2
    assert result == 16
    assert client.get("total") == b"16"
