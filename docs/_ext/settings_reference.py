"""The settings reference page, written from the settings catalogue at each build.

``docs/reference/settings.md`` includes ``docs/_generated/settings.md``, which
this extension writes from :func:`celery_leader.settings.reference.render_markdown`
when the build starts: the page cannot drift from the settings the code reads,
because it has no other source. The generated file is not kept in git.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.application import Sphinx

from celery_leader.settings.reference import render_markdown

#: Where the generated page lands, beside the sources (an include must be under the source dir).
GENERATED = Path("_generated") / "settings.md"


def body_of(markdown: str) -> str:
    """The rendered reference without its level-1 title: the including page has its own."""
    lines = markdown.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_reference(app: Sphinx) -> None:
    """Write the generated page, only when its text changed (so Sphinx need not reread it)."""
    target = Path(app.srcdir) / GENERATED
    text = body_of(render_markdown())
    if not target.exists() or target.read_text() != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def setup(app: Sphinx) -> dict[str, object]:
    """Generate the settings page as the build starts."""
    app.connect("builder-inited", write_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
