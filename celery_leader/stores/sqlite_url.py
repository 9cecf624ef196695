"""Where a ``sqlite://`` URL points: SQLAlchemy's rule, and the rolling-upgrade guard.

``sqlite:///relative.db`` is relative to the working directory and
``sqlite:////abs/path.db`` is absolute, as in SQLAlchemy and Celery's
``db+sqlite://``. Releases before 0.2 read ``sqlite:///leader.db`` as
``/leader.db``. During a rolling upgrade, old workers on ``/leader.db`` and new
ones on ``./leader.db`` would hold two elections with two leaders; so a
relative URL whose absolute twin exists is refused at start.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from celery_leader._masking import mask_url
from celery_leader.exceptions import ConfigurationError

EXAMPLES = "sqlite:///relative/leader.db or sqlite:////absolute/leader.db"


def sqlite_path(url: str) -> Path:
    """The absolute file path *url* names, resolved against the working directory now.

    Raises :class:`ConfigurationError` (one line naming ``leader_backend_url``)
    for a URL with a host, without a file, or whose directory is missing, and
    for a relative URL whose absolute twin exists (see the module docstring).
    """
    parts = urlsplit(url)
    shown = mask_url(url)
    if parts.netloc:
        raise ConfigurationError(
            f"leader_backend_url={shown!r} is not allowed: a SQLite URL has no host part; "
            f"use {EXAMPLES}"
        )
    # urlsplit keeps the slash that ends the empty authority: drop it (SQLAlchemy's rule).
    given = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not given or given.endswith("/") or given == ":memory:":
        raise ConfigurationError(
            f"leader_backend_url={shown!r} is not allowed: a SQLite store needs a file; "
            f"use {EXAMPLES}"
        )
    path = Path(given)
    if not path.is_absolute():
        twin = Path("/") / path
        path = Path.cwd() / path
        if twin.exists() and twin.resolve() != path.resolve():
            raise ConfigurationError(
                f"leader_backend_url={shown!r} is not allowed: it means {str(path)!r} "
                f"(relative to the working directory), but {str(twin)!r} exists, which "
                f"releases before 0.2 used for this URL; write 'sqlite:///{twin}' to keep "
                "that file, or remove it"
            )
    if not path.parent.is_dir():
        raise ConfigurationError(
            f"leader_backend_url={shown!r} is not allowed: the directory "
            f"{str(path.parent)!r} does not exist"
        )
    return path.absolute()
