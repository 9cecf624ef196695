"""The lease store on a Sentinel-managed Redis: the Redis store, reaching the current primary.

URL, in the form kombu and Celery use for a Sentinel broker::

    sentinel://[:password@]host:port[;sentinel://[:password@]host:port...][/db][?master_name=NAME]

Every sentinel listed is asked, in turn, for the current primary of
``master_name`` each time a connection is made (redis-py's
``SentinelConnectionPool``): after a failover the next call reaches the
promoted replica, and a connection to a primary that was demoted fails at
once (``READONLY``) instead of writing to a replica. Without ``master_name``
in the URL it is taken from ``leader_sentinel_master_name``, else from
``broker_transport_options["master_name"]`` (as Celery's Sentinel broker takes
it). The password is the primary's (and its replicas'); sentinels that need
one of their own take it from ``broker_transport_options["sentinel_kwargs"]``.

Guarantees: those of :mod:`celery_leader.stores.redis` (same scripts, same
keys), on whichever server is primary. What a failover does: replication is
asynchronous, so the promoted replica may lack the last acquire or renewals.
It always has another run id and replication id, so the next acquire there
sees another incarnation of the data, holds the new holder off one ttl and
takes its token from ``max(last + 1, server time, min + 1)``: the old holder,
which cannot renew on a server that never saw its lease, has declared loss
by then. Not covered: a partition that leaves the old holder with the old
primary, which it keeps renewing on while the others promote a replica.
redis-py asks the sentinels only when it opens a connection, so nothing
tells the holder. Configure the primary with ``min-replicas-to-write 1`` and
``min-replicas-max-lag`` below the ttl (it then refuses the renewals it
cannot replicate, and the holder declares loss in time), or fence the
work (tokens keep rising). The store reads the primary's setting once
per process and URL, after its first acquire (:func:`check_fencing`), and
warns when it lets unreplicated writes through. Tokens keep rising as
long as the servers' clocks agree to within the time since the last token
was granted (they are microseconds of server time). A failover while no
one leads costs nothing. As with Redis alone, every call is one command,
so a client stopped or cut off in the middle of one holds nothing on the
server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from celery_leader._catalogue import Owner, Setting, check, names_of, register
from celery_leader._masking import mask_url, split_urls
from celery_leader.exceptions import ConfigurationError
from celery_leader.stores.base import BrokerOptions, LeaseStoreClass
from celery_leader.stores.redis import RedisLeaseStore

logger = logging.getLogger(__name__)

#: The masked URLs whose primary was checked in this process (each is warned of once).
_CHECKED: set[str] = set()
_CHECKED_LOCK = threading.Lock()

#: The URL beginning this store serves.
SCHEME = "sentinel://"


def _master_name(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: it must be the name the sentinels monitor the "
            "primary under (a non-empty string)"
        )
    return value


def _sentinel_kwargs(name: str, value: Any) -> Mapping[str, Any]:
    # Named by type only: the mapping may hold the sentinels' password.
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{name} ({type(value).__name__}) is not allowed: it must be a mapping of "
            "connection options for the sentinels"
        )
    return value


#: The store option naming the primary when the URL does not.
MASTER_NAME_SETTING: Setting[str] = Setting(
    "leader_sentinel_master_name",
    Owner.STORE,
    default="`broker_transport_options['master_name']` when the broker uses the same sentinels",
    allowed="a non-empty string",
    description=(
        "The name the sentinels monitor the primary under, for a `sentinel://` URL without "
        "`?master_name=`."
    ),
    parse=_master_name,
    store=SCHEME,
)
#: Options for the connections to the sentinels themselves (a password of their own).
SENTINEL_KWARGS_SETTING: Setting[Mapping[str, Any]] = Setting(
    "leader_sentinel_kwargs",
    Owner.STORE,
    default="`broker_transport_options['sentinel_kwargs']` when the broker uses the same sentinels",
    allowed="a mapping of connection options",
    description=(
        "Connection options for the sentinels themselves, e.g. their own `password` (the "
        "URL's password is the primary's)."
    ),
    parse=_sentinel_kwargs,
    store=SCHEME,
)
SETTINGS = register(MASTER_NAME_SETTING, SENTINEL_KWARGS_SETTING)
MASTER_NAME = MASTER_NAME_SETTING.name
SENTINEL_KWARGS = SENTINEL_KWARGS_SETTING.name


class SentinelURL(NamedTuple):
    """What a ``sentinel://`` URL says."""

    sentinels: list[tuple[str, int]]
    username: str | None
    password: str | None
    db: int
    master_name: str | None


def parse_sentinel_url(url: str) -> SentinelURL:
    """The sentinels, the primary's credentials, db and name of a ``sentinel://`` URL.

    Raises :class:`~celery_leader.exceptions.ConfigurationError` naming the form.
    """
    sentinels: list[tuple[str, int]] = []
    username: str | None = None
    password: str | None = None
    db = 0
    master_name: str | None = None
    for piece in split_urls(url):
        part = piece.strip()
        if not part:
            continue
        try:
            split = urlsplit(part)
            port = split.port or 26379
        except ValueError:
            raise ConfigurationError(_bad_url(url, "a host:port is not valid")) from None
        if split.scheme != "sentinel" or not split.hostname:
            raise ConfigurationError(_bad_url(url, "each part must be sentinel://host:port"))
        sentinels.append((split.hostname, port))
        if split.password and password is None:
            password = unquote(split.password)
            username = unquote(split.username) if split.username else None
        elif split.username and not split.password and password is None:
            password = unquote(split.username)  # sentinel://secret@host: a password alone
        path = split.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigurationError(_bad_url(url, f"the database {path!r} is not a number"))
            db = int(path)
        query = dict(parse_qsl(split.query))
        master_name = query.get("master_name") or master_name
    if not sentinels:
        raise ConfigurationError(_bad_url(url, "no sentinel is listed"))
    return SentinelURL(sentinels, username, password, db, master_name)


def _bad_url(url: str, why: str) -> str:
    return (
        f"leader_backend_url={mask_url(url)} is not allowed: {why} (the form is "
        "sentinel://[:password@]host:port[;sentinel://host:port...][/db]?master_name=NAME)"
    )


class SentinelLeaseStore(RedisLeaseStore):
    """The Redis store on the primary the sentinels name; see the module docstring."""

    schemes: ClassVar[tuple[str, ...]] = (SCHEME,)
    option_keys: ClassVar[frozenset[str]] = names_of(SETTINGS)

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Check ``leader_sentinel_master_name`` and ``leader_sentinel_kwargs``."""
        check(SETTINGS, options)

    @classmethod
    def options_from_broker(
        cls, url: str, broker_url: str, transport_options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The primary's name and the sentinels' options of a Sentinel broker on *url*'s sentinels.

        Celery's Sentinel broker reads them from ``broker_transport_options``.
        Only for the broker's own sentinels: another deployment's name and
        password would be wrong, and the password must not travel to
        sentinels it was not meant for.
        """
        if _sentinel_hosts(url) is None or _sentinel_hosts(broker_url) != _sentinel_hosts(url):
            return {}
        found: dict[str, Any] = {}
        if transport_options.get("master_name"):
            found[MASTER_NAME] = transport_options["master_name"]
        if transport_options.get("sentinel_kwargs"):
            found[SENTINEL_KWARGS] = transport_options["sentinel_kwargs"]
        return found

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> RedisLeaseStore:
        """Open a store on the primary that the sentinels of *url* name.

        Timeouts as the Redis store's: half of *timeout* to connect and to
        read, no retries of redis-py's own (the lease manager retries).
        """
        options = options or {}
        cls.validate_options(options)
        parsed = parse_sentinel_url(url)
        master_name = parsed.master_name or options.get(MASTER_NAME)
        if not master_name:
            raise ConfigurationError(
                f"leader_backend_url={mask_url(url)} names no primary: add "
                "?master_name=NAME, or set leader_sentinel_master_name (or "
                "broker_transport_options['master_name'])"
            )
        connection = {
            "socket_timeout": timeout / 2,
            "socket_connect_timeout": timeout / 2,
            "retry": Retry(NoBackoff(), 0),
        }
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            parsed.sentinels,
            sentinel_kwargs={**connection, **dict(options.get(SENTINEL_KWARGS) or {})},
            **connection,
        )
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            master_name,
            db=parsed.db,
            username=parsed.username,
            password=parsed.password,
            decode_responses=True,
            client_name="celery-leader",
            **connection,
        )
        store = cls(client, url)
        store.master_name = master_name
        return store

    #: The name the sentinels monitor the primary under.
    master_name: str = ""
    #: True once this store looked at the primary's min-replicas-to-write.
    fencing_checked = False

    def _check_server(self) -> None:
        """The Redis store's checks, and whether the primary fences a holder cut off with it."""
        super()._check_server()
        with _CHECKED_LOCK:
            first = self.url not in _CHECKED
            _CHECKED.add(self.url)
        if first:
            check_fencing(self._client, self.master_name)
        self.fencing_checked = True


def check_fencing(client: redis.Redis, master_name: str) -> None:
    """Warn when the primary accepts writes no replica got (``min-replicas-to-write 0``).

    Such a primary, cut off with a holder, keeps taking its renewals while
    the sentinels promote a replica: two workers lead until the partition
    heals. Read with ``CONFIG GET``; a user not allowed to read it (an ACL,
    a renamed CONFIG) is told at INFO. Never raises.
    """
    try:
        found = client.config_get("min-replicas-*")
    except redis.ResponseError as exc:
        logger.info(
            "celery-leader: cannot read min-replicas-to-write of Sentinel primary %r (%s): make "
            "sure it is 1 or more, with min-replicas-max-lag below the lease ttl",
            master_name,
            str(exc).split("\n", 1)[0][:120],
        )
        return
    except (redis.RedisError, OSError):
        return
    if int(found.get("min-replicas-to-write", 0) or 0) < 1:
        logger.warning(
            "celery-leader: Sentinel primary %r has min-replicas-to-write 0: a holder cut off "
            "together with it keeps renewing there while the sentinels promote a replica, and "
            "two workers lead until the partition heals. Set min-replicas-to-write 1 and "
            "min-replicas-max-lag below the lease ttl on the primary and its replicas, or fence "
            "the work with the lease token",
            master_name,
        )


def _sentinel_hosts(url: str) -> frozenset[tuple[str, int]] | None:
    """The sentinels a ``sentinel://`` URL lists; None for any other URL or a bad one."""
    if urlsplit(url).scheme != "sentinel":
        return None
    try:
        return frozenset(parse_sentinel_url(url).sentinels)
    except ConfigurationError:
        return None


#: The class declares what the registry, the settings and the tests read (checked by mypy).
_DECLARES: LeaseStoreClass = SentinelLeaseStore
_TAKES_BROKER_OPTIONS: BrokerOptions = SentinelLeaseStore
