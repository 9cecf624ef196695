"""Redis lease store (``redis://``, ``rediss://``, ``unix://``).

Safety statement
----------------
One Redis server (or a primary with no failover) gives mutual exclusion under
the lease manager's timing assumptions and one of its own, that the Redis
host's wall clock is never stepped (see below): every operation is one Lua
script, expiry runs on the server's clock, and renew/release compare the
holder's lease id before touching the key.

What Redis can do to a lease, and what this store does about it:

* **Tokens never repeat and never go back**: every acquire issues
  ``max(last + 1, server time in microseconds)``. A counter that a restore
  brought back behind the latest term (or that was lost) cannot produce an
  earlier token, provided the server's clock does not go back by more than
  the time between two acquisitions.
* **A store that forgot is noticed by what a copy of the data cannot bring
  back**: the data's *incarnation*, read from ``INFO`` inside the acquire
  script: the server's ``run_id`` (a new one at every start), its replication
  id (a new one at every promotion of a replica, so a failover and a failover
  back both change it) and how often commands that replace data in place have
  run in this process (``FLUSHALL``, ``FLUSHDB``, ``SWAPDB``, ``RESTORE``,
  ``DEBUG RELOAD``, ``REPLICAOF``). Each acquire records it; a different one
  at the next acquire means the data may be older than the latest term. That
  covers a restart without persistence or from an RDB snapshot or AOF older
  than the last write, a failover to a replica and back, a replica promoted,
  and data flushed, swapped or reloaded without a restart. Only acquires
  record it: a renewal or release that a slow network delivers late, on data
  restored under it, must not make that data look current. A lease that
  vanished before the end recorded for it (eviction of the short-TTL lease key
  by ``maxmemory-policy volatile-*``, or an operator's DEL) counts as
  forgotten too. Either way the new holder holds off one ttl, since the old
  holder may still trust its local validity that long. A first acquire on a
  new store (or on one written by an older version) holds off too, and so
  does a restart that kept every write (the store cannot tell it from one
  that did not). When ``maxmemory`` is set with an eviction policy, the store
  warns once.
* **An ACL user without INFO** (``-@dangerous``): the incarnation is
  unknown, so every acquire holds off one ttl (a handover after a release
  too), and the store warns once, naming ``+info``. Safe, but slower.
* **The data alone cannot tell**: an older copy of the data, loaded, looks
  exactly like data on which the last holder stopped renewing. That is why
  the incarnation is read from the server, not written into the data. Keys
  of this store written by hand (SET, RENAME or COPY onto them, a foreign
  script) are not noticed.
* **Failover of a replicated Redis** (Sentinel, cluster): the new primary's
  incarnation differs, so the new holder holds off as above, and tokens keep
  rising as long as the new primary's clock is not behind. Writes the old
  primary acknowledged but never replicated are lost. Fencing tokens, not the
  lease, protect your data across such a failover, and against two primaries
  at once (a partition in which clients reach both).
* **The server's wall clock**: Redis keeps a key's expiry as absolute unix
  milliseconds and compares it with its wall clock (``gettimeofday``; no
  command exposes a monotonic clock, and ``TIME`` is the wall clock too). A
  step forward of the Redis host's clock ends every lease early, with no
  hold-off, while its holder still trusts it: the store host's clock must be
  slewed, never stepped (NTP or chrony stepping only at boot, before Redis
  starts). A step back makes leases last longer and can hold tokens back to
  ``last + 1`` (see above).
* **Pauses** (a stopped server, a long fork): calls time out on the client
  after ``timeout`` seconds; the holder declares loss before its validity
  ends. An acquire that timed out may still be applied when the server
  resumes: the next acquire recognises the caller's own lease id and takes
  it over with a new token instead of waiting a ttl.
* **A stopped or cut-off client holds nothing**: every call is one command
  (a script, which Redis runs whole once the command has arrived, or a
  read); no ``WATCH``/``MULTI`` and no lock lives across two round trips. A
  worker stopped (SIGSTOP, a paused container) or partitioned in the middle
  of a call leaves nothing the leader's renewals or the next acquire wait on
  (a holder that stops keeps its lease, which ends at its TTL).

Keys, per election name ``N`` (the braces keep them in one cluster slot):
``celery-leader:{N}:lease`` (JSON holder record with the lease's length, with a TTL),
``celery-leader:{N}:token`` (the fencing counter, no TTL),
``celery-leader:{N}:meta`` (the incarnation of the data at the last acquire,
the server's run id for earlier versions, and the end recorded for the
lease; no TTL),
``celery-leader:{N}:state`` (a hash the holder may write, e.g. beat's last
sends; no TTL) and the pub/sub
channel ``celery-leader:{N}:released``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, ClassVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_leader._masking import mask_text, mask_url
from celery_leader.exceptions import (
    StoreAuthError,
    StoreCallTimeoutError,
    StoreError,
    StoreUnreachableError,
)
from celery_leader.stores.base import (
    AcquireRequest,
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStoreClass,
    Lifeline,
    LifelineReading,
    Watch,
)
from celery_leader.stores.redis_lifeline import LifelineReader, RedisLifeline
from celery_leader.stores.watch import WatchThread

logger = logging.getLogger(__name__)

KEY_PREFIX = "celery-leader"

_AUTH_MARKERS = ("WRONGPASS", "NOAUTH", "NOPERM", "invalid username-password", "AUTH")

#: Said when the server wants a password and the URL gives none. redis-py's own words
#: ("HELLO must be called with the client already authenticated...", "NOAUTH
#: Authentication required") name neither the cause nor the setting.
ERR_AUTH_NEEDED = (
    "the server needs a password and leader_backend_url gives none "
    "(write it before the host: :PASSWORD@, or USER:PASSWORD@ for an ACL user)"
)
#: Said when the server refused the user name or password the URL gives.
ERR_AUTH_REFUSED = (
    "the server refused the password in leader_backend_url (check the credentials: a wrong "
    "password, or an ACL user that does not exist or is disabled)"
)
#: Said when the URL gives a password to a server that has none set.
ERR_AUTH_UNEXPECTED = (
    "leader_backend_url gives a password, but the server has none set for its default user"
)


def lease_key(name: str) -> str:
    """The key that holds the lease record of election *name*."""
    return f"{KEY_PREFIX}:{{{name}}}:lease"


def token_key(name: str) -> str:
    """The key that holds the fencing counter of election *name*."""
    return f"{KEY_PREFIX}:{{{name}}}:token"


def meta_key(name: str) -> str:
    """The hash recording the data's incarnation at the last acquire, and when its lease ends."""
    return f"{KEY_PREFIX}:{{{name}}}:meta"


def state_key(name: str) -> str:
    """The hash that holds the small state kept beside the lease of *name*."""
    return f"{KEY_PREFIX}:{{{name}}}:state"


def members_key(group: str) -> str:
    """The sorted set of *group*'s members, scored by when each expires (server ms)."""
    return f"{KEY_PREFIX}:{{{group}}}:members"


def payloads_key(group: str) -> str:
    """The hash of *group*'s members' payloads."""
    return f"{KEY_PREFIX}:{{{group}}}:payloads"


def release_channel(name: str) -> str:
    """The pub/sub channel on which releases of *name* are announced."""
    return f"{KEY_PREFIX}:{{{name}}}:released"


# The opening of every script that acts only for the holder: it returns 0
# unless KEYS[1] holds a lease record whose lease id is ARGV[1].
_HELD_BY_ARGV1 = """
    local current = redis.call('GET', KEYS[1])
    if not current then return 0 end
    local ok, rec = pcall(cjson.decode, current)
    if not ok or type(rec) ~= 'table' or rec['lease_id'] ~= ARGV[1] then return 0 end
"""


# The incarnation of the data a script sees, compared by ACQUIRE_LUA with the one
# recorded at the last acquire: anything that can put older or other data under
# the lease changes it. The server process (run_id: every restart, from any
# file), its replication id (master_replid: a new one at every promotion, so a
# failover and a failover back both change it, and a replica that synced takes
# its primary's), and how often the commands that replace data in place have
# run in this process (FLUSHALL, FLUSHDB, SWAPDB, RESTORE, DEBUG RELOAD,
# REPLICAOF; CONFIG RESETSTAT changes the counts too). Every one of these is
# outside the data: a copy of the data cannot carry a later state of them.
# Returns (incarnation, run_id), or (false, nil) when INFO is refused (an ACL
# user with -@dangerous): then nothing can tell a restart, and callers must
# hold off.
_INCARNATION = """
    local function incarnation()
      local server = redis.pcall('INFO', 'server')
      local replication = redis.pcall('INFO', 'replication')
      local stats = redis.pcall('INFO', 'commandstats')
      if type(server) ~= 'string' or type(replication) ~= 'string'
         or type(stats) ~= 'string' then
        return false, nil
      end
      local run_id = string.match(server, 'run_id:(%x+)') or '?'
      local parts = {run_id, string.match(replication, 'master_replid:(%x+)') or '?'}
      for _, name in ipairs({'flushall', 'flushdb', 'swapdb', 'restore', 'restore%-asking',
                             'debug', 'replicaof', 'slaveof'}) do
        parts[#parts + 1] = string.match(stats, 'cmdstat_' .. name .. ':calls=(%d+)') or '0'
      end
      return table.concat(parts, ':'), run_id
    end
"""


# ACQUIRE_LUA's body: KEYS and ARGV as described there (CALL_MANY_LUA runs it as a
# function of its own KEYS and ARGV, once per lease).
_ACQUIRE_BODY = """
    local now = redis.call('TIME')
    local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local current = redis.call('GET', KEYS[1])
    -- ARGV[7]: a hold-off carried over from a term taken over (TAKE_OVER_LUA); else none.
    local hold_until = tonumber(ARGV[7]) or 0
    if current then
      local ok, rec = pcall(cjson.decode, current)
      if not ok or type(rec) ~= 'table' or rec['lease_id'] ~= ARGV[1] then
        return {0, redis.call('PTTL', KEYS[1]), current}
      end
      hold_until = tonumber(rec['hold_until_us']) or 0
    end
    local ttl_us = tonumber(ARGV[3]) * 1000
    local seen, run_id = incarnation()
    local recorded_end = tonumber(redis.call('HGET', KEYS[3], 'lease_end_us')) or 0
    if not seen or redis.call('HGET', KEYS[3], 'incarnation') ~= seen
       or (not current and recorded_end > now_us) then
      -- The store forgot: the old holder may still act. Never shorter than a
      -- hold-off this holder's own live lease recorded already.
      hold_until = math.max(hold_until, now_us + ttl_us)
    end
    local raw_last = redis.call('GET', KEYS[2])
    local last = 0
    if raw_last then
      last = tonumber(raw_last)
      if not last then return redis.error_reply('the token counter is not a number') end
    end
    local token = math.max(last + 1, now_us, tonumber(ARGV[4]) + 1)
    local token_text = string.format('%d', token)
    redis.call('SET', KEYS[2], token_text)
    -- run_id is kept for workers of earlier versions during a rolling upgrade.
    redis.call('HSET', KEYS[3], 'incarnation', seen or '', 'run_id', run_id or '',
               'lease_end_us', string.format('%d', now_us + ttl_us))
    local hold_us = hold_until - now_us
    if hold_us < 0 then hold_us = 0 end
    local value = ARGV[2] .. ',"token":' .. token_text
      .. ',"acquired_at":' .. now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
      .. ',"hold_until_us":' .. string.format('%d', hold_until)
      .. ',"ttl_ms":' .. string.format('%d', tonumber(ARGV[3])) .. '}'
    redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
    local blind = 0
    if not seen then blind = 1 end
    return {1, token_text, hold_us, blind}
    """


def _acquire_keys(name: str) -> list[str]:
    """ACQUIRE_LUA's KEYS for election *name*."""
    return [lease_key(name), token_key(name), meta_key(name)]


def _acquire_args(holder: Holder, ttl: float, min_token: int) -> list[str | int]:
    """ACQUIRE_LUA's ARGV: the holder record is written by the script, with its token."""
    prefix = json.dumps(
        {
            "lease_id": holder.lease_id,
            "nodename": holder.nodename,
            "hostname": holder.hostname,
            "pid": holder.pid,
            "lifeline": holder.lifeline,
        }
    )[:-1]
    return [holder.lease_id, prefix, max(1, int(ttl * 1000)), int(min_token)]


class RedisLeaseStore:
    """Leases in one Redis key per election, with Lua compare-and-set."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.RELEASE_NOTIFICATION,
            Capability.SERVER_TIME,
            Capability.FENCING_SURVIVES_DATA_LOSS,
            Capability.MULTI_HOST,
            Capability.LIFELINE,
        }
    )
    schemes: ClassVar[tuple[str, ...]] = ("redis://", "rediss://", "unix://")
    extra: ClassVar[str | None] = None
    ttl_range: ClassVar[tuple[float | None, float | None]] = (None, None)
    default_renew_fraction: ClassVar[float] = 1 / 3
    option_keys: ClassVar[frozenset[str]] = frozenset()

    # KEYS[1] lease key, KEYS[2] token counter, KEYS[3] meta hash.
    # ARGV[1] lease id, ARGV[2] holder JSON without its closing brace,
    # ARGV[3] ttl in ms, ARGV[4] lowest token the caller will accept minus one.
    # Returns {1, token, hold_off_us, 0 or 1} when acquired (1: INFO was refused,
    # so the data's incarnation is unknown and the hold-off is always one ttl),
    # {0, pttl_ms, value} when not.
    # The token and the hold-off follow celery_leader/stores/rules.py, which cannot run
    # here: tests/stores/test_rules_oracle.py holds this script to it on the same inputs.
    # Tokens are max(last + 1, server time in us, floor + 1): Lua numbers are
    # doubles, exact to 2^53 (the clock reaches that in the year 2255). They
    # leave Lua through string.format('%d'): tostring() keeps only 14 digits.
    ACQUIRE_LUA = _INCARNATION + _ACQUIRE_BODY

    # ACQUIRE_LUA's KEYS and ARGV, then ARGV[5] the dead term's token, ARGV[6] its lifeline
    # key. When the lease is held by that very term (token and lifeline), it is freed as a
    # release frees it (no "the store forgot" from its early end), then ACQUIRE_LUA runs,
    # keeping what is left of the dead term's hold-off; any other lease answers as
    # ACQUIRE_LUA does.
    TAKE_OVER_LUA = (
        _INCARNATION
        + "local function acquire_one(KEYS, ARGV)\n"
        + _ACQUIRE_BODY
        + "end\n"
        + """
    local current = redis.call('GET', KEYS[1])
    local carried = 0
    if current and ARGV[6] ~= '' then
      local ok, rec = pcall(cjson.decode, current)
      if ok and type(rec) == 'table' and rec['lifeline'] == ARGV[6]
         and type(rec['token']) == 'number' and string.format('%d', rec['token']) == ARGV[5] then
        redis.call('DEL', KEYS[1])
        redis.call('HSET', KEYS[3], 'lease_end_us', '0')
        -- What is left of the dead term's hold-off goes on: the holder the store
        -- forgot, which that term held off for, may act until it ends.
        carried = tonumber(rec['hold_until_us']) or 0
      end
    end
    return acquire_one(KEYS, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], carried})
    """
    )

    # KEYS[1] lease key, KEYS[2] meta hash. ARGV[1] lease id, ARGV[2] ttl in ms.
    # Returns 1 when the lease was ours and now lasts ttl from now, else 0.
    RENEW_LUA = (
        _HELD_BY_ARGV1
        + """
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local now = redis.call('TIME')
    local end_us = tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(ARGV[2]) * 1000
    redis.call('HSET', KEYS[2], 'lease_end_us', string.format('%d', end_us))
    return 1
    """
    )

    # KEYS: lease key and meta hash of each lease renewed, in pairs, then lease key, token
    # counter and meta hash of each lease acquired. ARGV[1] number of renewals, ARGV[2] ttl
    # in ms, the lease id of each renewal, then ACQUIRE_LUA's four ARGV of each acquire.
    # Returns {renewals: 1 / 0 each, acquires: ACQUIRE_LUA's reply each, or {-1, error}}.
    CALL_MANY_LUA = (
        _INCARNATION
        + "local function acquire_one(KEYS, ARGV)\n"
        + _ACQUIRE_BODY
        + "end\n"
        + """
    local renewals = tonumber(ARGV[1])
    local ttl = tonumber(ARGV[2])
    local now = redis.call('TIME')
    local end_us = tonumber(now[1]) * 1000000 + tonumber(now[2]) + ttl * 1000
    local renewed = {}
    -- pcall: a key holding another type answers for its own lease only.
    for i = 1, renewals do
      local answer = 0
      local current = redis.pcall('GET', KEYS[2 * i - 1])
      if type(current) == 'string' then
        local ok, rec = pcall(cjson.decode, current)
        if ok and type(rec) == 'table' and rec['lease_id'] == ARGV[i + 2] then
          redis.call('PEXPIRE', KEYS[2 * i - 1], ttl)
          local set = redis.pcall('HSET', KEYS[2 * i], 'lease_end_us', string.format('%d', end_us))
          if type(set) == 'number' then answer = 1 end
        end
      end
      renewed[i] = answer
    end
    local acquired = {}
    local key0, arg0 = 2 * renewals, 2 + renewals
    for j = 1, (#KEYS - key0) / 3 do
      local k = {KEYS[key0 + 3 * j - 2], KEYS[key0 + 3 * j - 1], KEYS[key0 + 3 * j]}
      local a = {ARGV[arg0 + 4 * j - 3], ARGV[arg0 + 4 * j - 2], ARGV[arg0 + 4 * j - 1],
                 ARGV[arg0 + 4 * j]}
      local ok, reply = pcall(acquire_one, k, a)
      if not ok then
        -- Redis 7.2 and Valkey raise a table {err = message}, earlier ones a string.
        if type(reply) == 'table' and reply['err'] then reply = reply['err'] end
        acquired[j] = {-1, tostring(reply)}
      elseif type(reply) == 'table' and reply['err'] then
        acquired[j] = {-1, reply['err']}
      else
        acquired[j] = reply
      end
    end
    return {renewed, acquired}
    """
    )

    # KEYS[1] lease key, KEYS[2] meta hash. ARGV[1] lease id, ARGV[2] release channel.
    # Returns 1 when the lease was ours and is now deleted (and announced), else 0.
    RELEASE_LUA = (
        _HELD_BY_ARGV1
        + """
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[2], 'lease_end_us', '0')
    redis.call('PUBLISH', ARGV[2], 'released')
    return 1
    """
    )

    # KEYS[1] lease key, KEYS[2] state hash. ARGV[1] lease id, ARGV[2] field, ARGV[3] value.
    # Returns 1 when the lease is ours and the field was set, else 0.
    SET_STATE_LUA = (
        _HELD_BY_ARGV1
        + """
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
    return 1
    """
    )

    # KEYS[1] lease key. Returns {value or false, pttl_ms, now_us as string}.
    READ_LUA = """
    local now = redis.call('TIME')
    local value = redis.call('GET', KEYS[1])
    return {value, redis.call('PTTL', KEYS[1]),
            now[1] .. string.format('%06d', tonumber(now[2]))}
    """

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """No keys of its own: everything is in the URL."""

    # KEYS[1] members (sorted by expiry, server ms), KEYS[2] payloads.
    # ARGV[1] member ("" to only withdraw nobody), ARGV[2] payload, ARGV[3] ttl in ms,
    # ARGV[4] "1" to withdraw ARGV[1] instead of announcing it.
    # Drops expired members, then returns every live member's payload (flat list).
    ANNOUNCE_LUA = """
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local ttl = tonumber(ARGV[3])
    if ARGV[4] == '1' then
      redis.call('ZREM', KEYS[1], ARGV[1])
      redis.call('HDEL', KEYS[2], ARGV[1])
    else
      redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
      redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    end
    local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, member in ipairs(gone) do
      redis.call('HDEL', KEYS[2], member)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    -- The group outlives its last member by one ttl at most (a withdrawal leaves it as is).
    if ARGV[4] ~= '1' then
      redis.call('PEXPIRE', KEYS[1], ttl * 2)
      redis.call('PEXPIRE', KEYS[2], ttl * 2)
    end
    return redis.call('HGETALL', KEYS[2])
    """

    def __init__(self, client: redis.Redis, url: str) -> None:
        self._client = client
        self.url = mask_url(url)
        self._acquire = client.register_script(self.ACQUIRE_LUA)
        self._renew = client.register_script(self.RENEW_LUA)
        self._release = client.register_script(self.RELEASE_LUA)
        self._read = client.register_script(self.READ_LUA)
        self._set_state = client.register_script(self.SET_STATE_LUA)
        self._announce = client.register_script(self.ANNOUNCE_LUA)
        self._call_many = client.register_script(self.CALL_MANY_LUA)
        self._take_over = client.register_script(self.TAKE_OVER_LUA)
        pool = client.connection_pool
        self._timeout = float(pool.connection_kwargs.get("socket_timeout") or 1.0) * 2
        self._lifeline_reader = LifelineReader(pool, self._timeout, self.url)
        #: False once the server refused a script across hash slots (cluster mode).
        self.batches = True
        self._eviction_checked = False
        self._info_warned = False

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> RedisLeaseStore:
        """Open a store on *url*; each call is bounded by about *timeout* seconds.

        Connect and read timeouts are half of *timeout* each, and redis-py's
        own retries are off: the lease manager retries, within the lease.
        """
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout / 2,
            socket_connect_timeout=timeout / 2,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            client_name="celery-leader",
        )
        return cls(client, url)

    @contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except redis.AuthenticationError as exc:
            raise StoreAuthError(self._auth_message(what, exc)) from None
        except redis.ResponseError as exc:
            if any(marker in str(exc) for marker in _AUTH_MARKERS):
                raise StoreAuthError(self._auth_message(what, exc)) from None
            raise StoreError(self._message(what, exc)) from None
        except (redis.ConnectionError, ConnectionError) as exc:
            raise StoreUnreachableError(self._message(what, exc)) from None
        except redis.TimeoutError as exc:
            raise StoreCallTimeoutError(self._message(what, exc)) from None
        except (redis.RedisError, OSError) as exc:
            raise StoreError(self._message(what, exc)) from None

    def _message(self, what: str, exc: BaseException) -> str:
        detail = mask_text(str(exc)) or type(exc).__name__
        return f"lease store {self.url}: {what} failed: {detail}"

    def _auth_message(self, what: str, exc: BaseException) -> str:
        """What a refused authentication means, in words naming ``leader_backend_url``.

        Whether the URL gave a password is read from the client's connection
        settings (the Sentinel store's too), never the password itself. An
        ACL refusal of a command or key (``NOPERM``) keeps the server's words:
        they name what is not allowed.
        """
        text = str(exc)
        if "NOPERM" in text:
            return self._message(what, exc)
        if "without any password configured" in text:
            reason = ERR_AUTH_UNEXPECTED
        elif self._client.connection_pool.connection_kwargs.get("password"):
            reason = ERR_AUTH_REFUSED
        else:
            reason = ERR_AUTH_NEEDED
        return f"lease store {self.url}: {what} failed: {reason}"

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free or ours; see the module docstring for data loss."""
        with self._translated("acquire"):
            reply = self._acquire(
                keys=_acquire_keys(name), args=_acquire_args(holder, ttl, min_token)
            )
        self._check_server_once()
        return self._acquired(reply)

    def _acquired(self, reply: Any) -> AcquireResult:
        """ACQUIRE_LUA's reply as a result."""
        if int(reply[0]) == 1:
            if int(reply[3]) == 1:
                self._warn_without_info()
            return AcquireResult(acquired=True, token=int(reply[1]), hold_off=int(reply[2]) / 1e6)
        pttl_ms = int(reply[1])
        record = _parse_record(reply[2], pttl_ms / 1000, 0.0)
        return AcquireResult(
            acquired=False,
            holder=record,
            retry_in=pttl_ms / 1000 if pttl_ms >= 0 else None,
            foreign=record is None,
        )

    def _warn_without_info(self) -> None:
        """Once per store: say that the ACL user lacks INFO, and what that costs."""
        if self._info_warned:
            return
        self._info_warned = True
        logger.warning(
            "celery-leader: %s refuses INFO to this user, so a restart or reload of Redis "
            "cannot be told apart: every new leader waits one ttl; grant +info "
            "(ACL SETUSER <user> +info) for immediate handovers",
            self.url,
        )

    def _check_server_once(self) -> None:
        """Once per store, after its first acquire: warn of server settings that break a guarantee.

        On the caller's thread, within the store's call timeout per read;
        never raises.
        """
        if self._eviction_checked:
            return
        self._eviction_checked = True
        self._check_server()

    def _check_server(self) -> None:
        """Warn when the server may evict the lease's keys."""
        try:
            memory = self._client.info("memory")
        except redis.RedisError:
            return
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if int(memory.get("maxmemory", 0) or 0) > 0 and policy != "noeviction":
            logger.warning(
                "celery-leader: %s may evict keys (maxmemory-policy %s): an evicted lease "
                "makes the next leader wait one ttl; give the lease store its own Redis "
                "or database with maxmemory-policy noeviction",
                self.url,
                policy,
            )

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """See :class:`~celery_leader.stores.base.Lifelines`: one script, a CAS on the term."""
        args = [*_acquire_args(holder, ttl, min_token), str(dead.token), dead.lifeline]
        with self._translated("take over"):
            reply = self._take_over(keys=_acquire_keys(name), args=args)
        return self._acquired(reply)

    def open_lifeline(self) -> Lifeline:
        """A subscribed connection of this process (:mod:`celery_leader.stores.redis_lifeline`)."""
        return RedisLifeline(self._client.connection_pool, self._timeout, self.url)

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        """``PUBSUB NUMSUB`` of the keys' channels on the readings' own connection."""
        return self._lifeline_reader.read(keys)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Compare-and-set PEXPIRE on our own lease (and its recorded end)."""
        with self._translated("renew"):
            reply = self._renew(
                keys=[lease_key(name), meta_key(name)], args=[lease_id, int(ttl * 1000)]
            )
        return int(reply) == 1

    def call_many(
        self, renewals: list[tuple[str, str]], acquires: list[AcquireRequest], ttl: float
    ) -> tuple[list[bool], list[AcquireResult | StoreError]]:
        """See :class:`~celery_leader.stores.base.BatchCalls`: one script for every lease.

        Each election's keys share one hash slot, but two elections' do not: a
        cluster-mode server refuses a script across slots (CROSSSLOT). Then, and
        from then on, each lease gets a call of its own.
        """
        if not self.batches or len(renewals) + len(acquires) == 1:
            return self._one_by_one(renewals, acquires, ttl)
        keys = [key for name, _ in renewals for key in (lease_key(name), meta_key(name))]
        keys += [key for request in acquires for key in _acquire_keys(request.name)]
        args: list[str | int] = [len(renewals), int(ttl * 1000)]
        args += [lease_id for _, lease_id in renewals]
        for request in acquires:
            args += _acquire_args(request.holder, ttl, request.min_token)
        try:
            with self._translated("renew and acquire" if acquires else "renew"):
                renewed, acquired = self._call_many(keys=keys, args=args)
        except StoreError as exc:
            if "CROSSSLOT" not in str(exc):
                raise
            self.batches = False
            return self._one_by_one(renewals, acquires, ttl)
        if acquires:
            self._check_server_once()
        answers: list[AcquireResult | StoreError] = []
        for request, reply in zip(acquires, acquired, strict=False):
            if int(reply[0]) == -1:
                error = StoreError(self._message(f"acquire {request.name}", Exception(reply[1])))
                answers.append(error)
            else:
                answers.append(self._acquired(reply))
        return [int(reply) == 1 for reply in renewed], answers

    def _one_by_one(
        self, renewals: list[tuple[str, str]], acquires: list[AcquireRequest], ttl: float
    ) -> tuple[list[bool], list[AcquireResult | StoreError]]:
        """:meth:`call_many` as one call per lease (a renewal's failure fails the whole call)."""
        renewed = [self.renew(name, lease_id, ttl) for name, lease_id in renewals]
        answers: list[AcquireResult | StoreError] = []
        for request in acquires:
            try:
                answers.append(self.acquire(request.name, request.holder, ttl, request.min_token))
            except StoreError as exc:
                answers.append(exc)
        return renewed, answers

    def release(self, name: str, lease_id: str) -> bool:
        """Compare-and-set DEL of our own lease, announced on the release channel."""
        with self._translated("release"):
            reply = self._release(
                keys=[lease_key(name), meta_key(name)], args=[lease_id, release_channel(name)]
            )
        return int(reply) == 1

    def read(self, name: str) -> LeaseRecord | None:
        """The holder record, or None when the lease is free or not ours to parse."""
        with self._translated("read"):
            value, pttl_ms, now_us = self._read(keys=[lease_key(name)])
        if not value:
            return None
        return _parse_record(value, int(pttl_ms) / 1000, int(now_us) / 1e6)

    def last_token(self, name: str) -> int | None:
        """The fencing counter of *name*; None when it is missing (never held, or data lost)."""
        with self._translated("read"):
            raw = self._client.get(token_key(name))
        try:
            return None if raw is None else int(raw)
        except (TypeError, ValueError):
            return None

    def get_state(self, name: str) -> dict[str, str]:
        """All fields of the state hash of *name*."""
        with self._translated("read state"):
            raw = self._client.hgetall(state_key(name))
        return {str(k): str(v) for k, v in raw.items()}

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """HSET one field, compare-and-set on our lease."""
        with self._translated("write state"):
            reply = self._set_state(
                keys=[lease_key(name), state_key(name)], args=[lease_id, key, value]
            )
        return int(reply) == 1

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """See :class:`~celery_leader.stores.base.Presence`: one script, one round trip."""
        return self._members(group, member, payload, ttl, withdraw=False)

    def withdraw(self, group: str, member: str) -> None:
        """See :class:`~celery_leader.stores.base.Presence`."""
        self._members(group, member, "", 1.0, withdraw=True)

    def _members(
        self, group: str, member: str, payload: str, ttl: float, *, withdraw: bool
    ) -> dict[str, str]:
        keys = [members_key(group), payloads_key(group)]
        args: list[str | int] = [member, payload, max(1, int(ttl * 1000)), "1" if withdraw else "0"]
        with self._translated("presence"):
            flat = self._announce(keys=keys, args=args)
        values = [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
        return dict(zip(values[::2], values[1::2], strict=True))

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Subscribe to the release channel in a daemon thread."""
        return _release_watch(self._client, release_channel(name), callback)

    def close(self) -> None:
        """Close the connection pool (a lifeline open on it stays: it closes by itself)."""
        self._lifeline_reader.close()
        self._client.close()


def _parse_record(value: object, expires_in: float, now: float) -> LeaseRecord | None:
    """Parse a lease value; None when it is not a record this store wrote.

    The lease key lasts ``ttl_ms`` from the acquire or the renewal that last
    landed (PEXPIRE), so that renewal was ``ttl_ms - PTTL`` ago, on the
    server's clock. A record without ``ttl_ms`` (written by an earlier
    version) cannot tell.
    """
    if not isinstance(value, str):
        return None
    try:
        data = json.loads(value)
        hold_until = int(data.get("hold_until_us", 0)) / 1e6
        ttl_ms = data.get("ttl_ms")
        renewed_ago = (
            max(0.0, int(ttl_ms) / 1000 - expires_in)
            if isinstance(ttl_ms, int) and ttl_ms > 0 and expires_in >= 0
            else None
        )
        return LeaseRecord(
            nodename=str(data["nodename"]),
            hostname=str(data["hostname"]),
            pid=int(data["pid"]),
            token=int(data["token"]),
            acquired_at=float(data["acquired_at"]),
            expires_in=expires_in,
            hold_off=max(0.0, hold_until - now) if now else 0.0,
            renewed_ago=renewed_ago,
            lifeline=str(data.get("lifeline") or ""),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _release_watch(client: redis.Redis, channel: str, callback: Callable[[], None]) -> Watch:
    """Listen on a release channel; call back on every message and every subscription.

    Each subscription, the first and every one after a reconnect, calls back
    once: a release published before the subscription was live reached no
    one, so the caller must look at the lease again. Spurious calls are cheap,
    missed ones are not. A failed connection is retried with a backoff of up to
    2 s; the thread ends within about a second of ``close()``.
    """

    def listen(watch: WatchThread) -> None:
        failures = 0
        while not watch.closed.is_set():
            pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(channel)
                watch.notify()
                failures = 0
                while not watch.closed.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        watch.notify()
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any client failure
                failures += 1
                logger.debug("release watch on %s interrupted: %s", channel, mask_text(str(exc)))
                watch.closed.wait(min(0.1 * 2**failures, 2.0))
            finally:
                with suppress(Exception):
                    pubsub.close()

    return WatchThread(channel, callback, listen)


#: The class declares what the registry, the settings and the tests read (checked by mypy).
_DECLARES: LeaseStoreClass = RedisLeaseStore
