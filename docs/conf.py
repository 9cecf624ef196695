"""Sphinx configuration of the celery-leader documentation.

Built with ``./run.sh docs`` (``sphinx-build -W --keep-going -n``): every
warning, an unresolved cross-reference included, fails the build. No
intersphinx: the build must not depend on fetching other projects'
inventories, so Celery and kombu are linked with plain URLs.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import celery_leader  # noqa: E402 - the package is installed; _ext first on the path

project = "celery-leader"
author = "celery-leader contributors"
copyright = "celery-leader contributors"
release = celery_leader.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "metrics_reference",
    "settings_reference",
    "trim_includes",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "examples/**/README.md"]
# The page the benchmarks write, and the dashboard's notes, are Markdown like the rest.
myst_enable_extensions = ["colon_fence", "deflist"]
# Headings become link targets (``page.md#some-heading``), checked like any other link.
myst_heading_anchors = 3
# A link to a file or heading that does not exist is a warning, and so fails the build.
myst_all_links_external = False

html_theme = "furo"
html_title = f"celery-leader {release}"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}

# Names the docstrings mention that have no page here: Celery's, kombu's, the
# standard library's (no intersphinx, see above) and the package's internals.
nitpick_ignore_regex = [
    (r"py:.*", r"(celery|kombu|billiard|click|redis|prometheus_client)(\..*)?"),
    (r"py:.*", r"(typing|collections\.abc|threading|datetime|pathlib|types|enum)\..*"),
    (r"py:.*", r"celery_leader\.(lease|stores|elections|term_end|tasks|worker|beat)\..*"),
    (r"py:class", r"celery_leader\.\w+\._\w+"),  # private type variables in signatures
    # Bare names in type hints and docstrings are the modules' own internals.
    (r"py:.*", r"[A-Za-z_]\w*"),
]
