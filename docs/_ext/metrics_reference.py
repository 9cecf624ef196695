"""The ``metrics-reference`` directive: the metrics table, read from the metric objects.

The table is made from the families that
:class:`celery_leader.observe.metrics.LeaderMetrics` registers, on a
registry of its own, so the page lists exactly what a worker exports: each
family's exposed name (with the ``_total`` suffix Prometheus adds to a
counter), its type, its labels and its help text. Label values that the
package fixes in code (a loss's ``reason``, a store error's ``kind``, a
skip's ``reason``) are listed from the same objects; the families read when
scraped (the watchdog's) from their collector's description. Nothing in the
table is typed by hand, so renaming a metric or a label changes the page
with it.
"""

from __future__ import annotations

from typing import ClassVar

from docutils import nodes
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from celery_leader.exceptions import STORE_ERROR_KINDS
from celery_leader.lease import LossReason
from celery_leader.observe.metrics import LeaderMetrics, WatchdogCollector
from celery_leader.skip_reasons import SLOT_SKIP_REASONS, TASK_SKIP_REASONS

#: The names a sample of each family type is exposed under, from the family's name.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
}
#: Label values fixed in code, per (family, label): every value a worker can report.
KNOWN_VALUES = {
    ("celery_leader_losses", "reason"): tuple(reason.value for reason in LossReason),
    ("celery_leader_store_errors", "kind"): STORE_ERROR_KINDS,
    ("celery_leader_tasks_skipped", "reason"): TASK_SKIP_REASONS,
    ("celery_leader_beat_slots_skipped", "reason"): SLOT_SKIP_REASONS,
}


def metric_families() -> list[tuple[str, str, tuple[str, ...], str]]:
    """Each family a worker registers, in registration order: name, type, labels, help."""
    metrics = LeaderMetrics(CollectorRegistry())
    families = []
    for value in vars(metrics).values():
        if isinstance(value, WatchdogCollector):
            families += [(f.name, f.type, f.labels, f.documentation) for f in value.FAMILIES]
        if not isinstance(value, MetricWrapperBase):
            continue
        (described,) = value.describe()
        labels = tuple(value._labelnames)
        families.append((described.name, described.type, labels, described.documentation))
    return families


def exposed_names(name: str, kind: str) -> list[str]:
    """The sample names a family of *kind* called *name* is scraped under."""
    return [name + suffix for suffix in SUFFIXES.get(kind, ("",))]


def _text_cell(*parts: nodes.Node) -> nodes.entry:
    paragraph = nodes.paragraph()
    paragraph.extend(parts)
    entry = nodes.entry()
    entry += paragraph
    return entry


def _labels_cell(name: str, labels: tuple[str, ...]) -> nodes.entry:
    parts: list[nodes.Node] = []
    for index, label in enumerate(labels):
        if index:
            parts.append(nodes.Text(", "))
        parts.append(nodes.literal(text=label))
        values = KNOWN_VALUES.get((name, label))
        if values:
            parts.append(nodes.Text(" (" + ", ".join(values) + ")"))
    return _text_cell(*parts)


class MetricsReference(SphinxDirective):
    """A table of every metric family: exposed name, type, labels, help."""

    has_content: ClassVar[bool] = False

    def run(self) -> list[nodes.Node]:
        """The table node; the families are read when the page is built."""
        header = ("metric", "type", "labels", "help")
        table = nodes.table()
        group = nodes.tgroup(cols=len(header))
        table += group
        for width in (40, 10, 25, 35):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        row = nodes.row()
        for title in header:
            row += _text_cell(nodes.Text(title))
        head += row
        group += head
        body = nodes.tbody()
        for name, kind, labels, help_text in metric_families():
            row = nodes.row()
            names: list[nodes.Node] = []
            for index, exposed in enumerate(exposed_names(name, kind)):
                if index:
                    names.append(nodes.Text(", "))
                names.append(nodes.literal(text=exposed))
            row += _text_cell(*names)
            row += _text_cell(nodes.Text(kind))
            row += _labels_cell(name, labels)
            row += _text_cell(nodes.Text(help_text))
            body += row
        group += body
        return [table]


def setup(app: Sphinx) -> dict[str, object]:
    """Register the directive (MyST pages use it as a ``{metrics-reference}`` fence)."""
    app.add_directive("metrics-reference", MetricsReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
