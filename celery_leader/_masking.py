"""Masking of secrets in URLs and free text.

Everything celery-leader prints or raises goes through here first, so that
passwords, account keys and SAS tokens never reach a log, the CLI or an
exception message.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

#: Query parameters whose values are secrets (Redis passwords, SAS tokens).
_SECRET_QUERY_KEYS = frozenset(
    {"password", "pass", "pwd", "sig", "secret", "token", "accountkey", "sharedaccesssignature"}
)

_CONNECTION_STRING_SECRET = re.compile(
    r"(?i)\b(AccountKey|SharedAccessSignature|SharedAccessKey|sig|password)=([^;&\s]+)"
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^:/@\s]*):([^@\s/]*)@")


def mask_url(url: str) -> str:
    """Return *url* with its password and secret query values replaced by ``***``.

    Keeps scheme, user name, host, port, path and harmless query values, so
    the result still tells an operator which store is meant.
    """
    if ";" in url and "://" in url.split(";", 1)[1]:
        # Several URLs in one (kombu's form for sentinels): each is masked on its own.
        return ";".join(mask_url(part) for part in url.split(";"))
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}{sep}{MASK if sep else ''}@{hostinfo}"
        if not sep and user and parts.scheme.startswith(("redis", "unix")):
            # redis://secret@host means "password only" to redis-py.
            netloc = f"{MASK}@{hostinfo}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*/"
        )
    masked = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not netloc and url.startswith(f"{parts.scheme}://"):
        # urlunsplit drops an empty authority: keep sqlite:///path and unix:///path intact.
        masked = f"{parts.scheme}://" + masked[len(parts.scheme) + 1 :]
    return masked


def mask_text(text: str) -> str:
    """Mask every URL password and connection-string secret found in *text*."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{MASK}@", text)
    return _CONNECTION_STRING_SECRET.sub(lambda m: f"{m.group(1)}={MASK}", text)
