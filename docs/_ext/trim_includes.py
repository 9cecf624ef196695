"""Included examples end at their last line of code, not at the blank lines after it.

The example files mark the part a page shows with comment lines
(``# [forms]`` ... ``# [end forms]``), and the formatter keeps two blank lines
before a top-level comment; ``literalinclude`` would show them at the end
of the block. This drops trailing blank lines from every block read from a
file, and changes nothing else.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx


def trim(app: Sphinx, doctree: nodes.document) -> None:
    """Strip trailing newlines from each literal block that came from a file."""
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if not block.get("source") or text == text.rstrip("\n"):
            continue
        trimmed = text.rstrip("\n")
        # rawsource too: the HTML writer highlights a block only when both agree.
        block.rawsource = trimmed
        block.children = [nodes.Text(trimmed)]


def setup(app: Sphinx) -> dict[str, object]:
    """Trim included blocks as each page is read."""
    app.connect("doctree-read", trim)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
