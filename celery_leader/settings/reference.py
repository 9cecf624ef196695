"""The settings reference: the catalogue as one Markdown page, grouped by owner.

``python -m celery_leader.settings.reference`` prints it; a documentation
build includes :func:`render_markdown`'s text as it is. Everything on the
page comes from the catalogue entries (:mod:`celery_leader.settings.catalogue`),
so a setting added anywhere, a store's included, is documented by declaring it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_leader._catalogue import Owner, Setting
from celery_leader.settings.catalogue import entries

INTRO = """\
# Settings reference

Every setting is optional, set on the Celery app (`app.conf.leader_lease_ttl = 10`).
In a Django project whose Celery app reads `config_from_object("django.conf:settings",
namespace="CELERY")`, write each one in upper case with the namespace, as its
*Django* line shows (`CELERY_LEADER_LEASE_TTL = 10`). A value of `None` or `""`
counts as not set. A bad value stops the worker (or beat) at start with one line
naming the setting as you wrote it, the value and what is allowed.

A setting that each process needs its own value of (a metrics port), where
every process reads the same app, also has an *Environment* variable, and a
worker's a *Worker option*: the option comes first, then the variable, then
the setting.
"""

#: Store sections are titled by the store's URL beginning.
_STORE_TITLE = "Store `{store}`"


def _group_key(setting: Setting[Any]) -> tuple[int, str]:
    return list(Owner).index(setting.owner), setting.store or ""


def _title(setting: Setting[Any]) -> str:
    if setting.store is not None:
        return _STORE_TITLE.format(store=setting.store)
    return setting.owner.value


def _cell(text: str) -> str:
    """*text* on one line (the fields are written as Markdown already)."""
    return " ".join(text.split()) or "none"


def _entry(setting: Setting[Any]) -> list[str]:
    overrides = []
    if setting.environment is not None:
        overrides.append(
            f"- Environment: `{setting.environment}`, one process's own value, read at its "
            "start; it overrides the setting"
        )
    if setting.option is not None:
        overrides.append(
            f"- Worker option: `celery worker {setting.option} ...`, one worker's own value; "
            "it overrides the setting and the environment (the app must call "
            "`celery_leader.install(app)`, which adds the option)"
        )
    return [
        f"### `{setting.name}`",
        "",
        _cell(setting.description),
        "",
        f"- Django: `{setting.django_name}`",
        f"- Default: {_cell(setting.default)}",
        f"- Allowed: {_cell(setting.allowed)}",
        *overrides,
        "",
    ]


def render_markdown(settings: Iterable[Setting[Any]] | None = None) -> str:
    """The settings reference as Markdown: one section per owner, one entry per setting.

    Sections come in the order election, beat, metrics, then each store by
    its URL beginning; entries in the order their owner declares them.
    *settings* defaults to the whole catalogue (every registered store's
    included).
    """
    chosen = list(entries() if settings is None else settings)
    order = {setting.name: index for index, setting in enumerate(chosen)}
    lines = [INTRO]
    title = None
    for setting in sorted(chosen, key=lambda s: (_group_key(s), order[s.name])):
        if _title(setting) != title:
            title = _title(setting)
            lines += [f"## {title}", ""]
        lines += _entry(setting)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
