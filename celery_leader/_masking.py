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
    {
        "password",
        "pass",
        "pwd",
        "sig",
        "secret",
        "token",
        "accountkey",
        "sharedaccesssignature",
        "sslpassword",
    }
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
    if _SEVERAL_URLS.search(url):
        # Several URLs in one (kombu's form for sentinels): each is masked on its own.
        return ";".join(mask_url(part) for part in split_urls(url))
    url = _hide_ambiguous_userinfo(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}{sep}{MASK if sep else ''}@{hostinfo}"
        if not sep and user and parts.scheme.startswith(("redis", "unix", "sentinel")):
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


#: The boundary between two URLs written as one (``sentinel://a;sentinel://b``).
_SEVERAL_URLS = re.compile(r";(?=[a-z][a-z0-9+.-]*://)")


def split_urls(url: str) -> list[str]:
    """The URLs of kombu's ``sentinel://a;sentinel://b`` form (a ``;`` in a password stays)."""
    return _SEVERAL_URLS.split(url)


def _hide_ambiguous_userinfo(url: str) -> str:
    """*url* with a password that would end the authority early (``/``, ``?``, ``#``) masked.

    ``postgresql://u:SEC/RET@host/db`` parses as host ``u:SEC``, path
    ``/RET@host/db``: the password would stay in the clear. Whatever lies
    between ``user:`` and the last ``@`` before the query is the password.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    head = rest.split("?", 1)[0]
    at = head.rfind("@")
    if at < 0:
        return url
    userinfo = head[:at]
    if not any(c in userinfo for c in "/?#"):
        return url
    user, colon, _password = userinfo.partition(":")
    masked_userinfo = f"{user}:{MASK}" if colon else MASK
    return f"{scheme}://{masked_userinfo}{rest[at:]}"


def mask_text(text: str) -> str:
    """Mask every URL password and connection-string secret found in *text*."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{MASK}@", text)
    return _CONNECTION_STRING_SECRET.sub(lambda m: f"{m.group(1)}={MASK}", text)
