"""Run every benchmark and write docs/benchmarks.md with a failover chart.

Run from the repository root:  .venv/bin/python -m benchmarks.report

Needs the ``bench`` extra (matplotlib for the chart, the peers RedBeat and
single-beat for the beat comparison). Each benchmark prints a markdown table;
this script keeps those tables verbatim, adds the machine, the versions and
the command, puts the failover figures side by side as ratios ours / theirs
at the top (benchmarks/headline.py), keeps every round's figures in
docs/benchmarks.json and draws them as docs/failover.png
(benchmarks/chart.py; ``--chart-only`` redraws it from that JSON).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from benchmarks import chart
from benchmarks.headline import headline

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FIGURES = DOCS / "benchmarks.json"
# (title, module, writes JSON figures for the headline and the chart)
BENCHMARKS = [
    ("Lease core (Redis)", "benchmarks.lease", False),
    ("Workers end to end (Redis broker and store)", "benchmarks.workers", True),
    ("Instructions per leader-only run (callgrind)", "benchmarks.instructions", False),
    ("A leader run in its pool child, warm and cold", "benchmarks.call_path", False),
    ("Azure Blob store (Azurite)", "benchmarks.azure", False),
    ("Every store beside Redis: Sentinel, PostgreSQL, etcd", "benchmarks.stores", False),
    ("Beat failover, side by side with RedBeat and single-beat", "benchmarks.beat", True),
    ("Per-call cost, side by side with celery-once and celery-singleton", "benchmarks.gate", False),
    ("Schedule controls: pause and run-now", "benchmarks.schedule", False),
    ("What an idle worker costs", "benchmarks.idle", False),
    ("Named elections: K elections on N workers", "benchmarks.elections", False),
    ("Named elections moving: a step-down, a worker's death", "benchmarks.election_moves", False),
    ("Fast failover: a leader's death seen at once", "benchmarks.fast_failover", True),
    ("What fast failover adds to the store's load", "benchmarks.lifeline_load", False),
    ("Who led each election, as Prometheus scraped it", "benchmarks.leader_timeline", False),
]
#: Arguments a benchmark is run with beyond ``--rounds`` (and ``--json``).
ARGUMENTS = {"benchmarks.fast_failover": ["--what", "workers", "beat"]}


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _tool(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "not installed"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def machine() -> list[str]:
    model = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kb = int(meminfo.read_text().split()[1])
        memory = f"{kb / 1024 / 1024:.0f} GiB"
    return [
        f"- machine: {os.cpu_count()} cores ({model}), {memory} memory, {platform.platform()}",
        f"- Python {platform.python_version()}; celery {_version('celery')}, "
        f"kombu {_version('kombu')}, redis-py {_version('redis')}, "
        f"azure-storage-blob {_version('azure-storage-blob')}, "
        f"celery-redbeat {_version('celery-redbeat')}, single-beat {_version('single-beat')}",
        f"- {_tool(['redis-server', '--version'])}",
        f"- Azurite {_tool([str(ROOT / 'node_modules/.bin/azurite-blob'), '--version'])}",
    ]


def draw_chart(figures: dict[str, Any]) -> bool:
    beat, workers = figures.get("benchmarks.beat"), figures.get("benchmarks.workers")
    if beat is None:
        return False
    fast = figures.get("benchmarks.fast_failover")
    return chart.draw(chart.series(beat, workers, fast), float(beat["cap"]), DOCS / "failover.png")


def run(
    module: str, json_out: Path | None, extra: list[str] | None = None
) -> tuple[str, dict[str, Any] | None]:
    """A benchmark's printed tables (or the tail of its error), and its JSON figures."""
    args = [sys.executable, "-m", module, *(extra or [])]
    if json_out is not None:
        args += ["--json", str(json_out)]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    output = proc.stdout.strip() or proc.stderr.strip()[-2000:]
    if proc.returncode != 0:
        output += f"\n\n(exited {proc.returncode}: {proc.stderr.strip()[-1500:]})"
    figures = None
    if json_out is not None and json_out.exists():
        figures = json.loads(json_out.read_text())
    return output, figures


def main() -> None:
    DOCS.mkdir(exist_ok=True)
    if "--chart-only" in sys.argv:
        drew = draw_chart(json.loads(FIGURES.read_text()))
        print(f"drew {DOCS / 'failover.png'}" if drew else "nothing drawn (no matplotlib?)")
        return
    # --rounds N is handed to every benchmark (each takes it): fewer rounds, a shorter run.
    extra = []
    if "--rounds" in sys.argv:
        extra = ["--rounds", sys.argv[sys.argv.index("--rounds") + 1]]
    sections, figures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for title, module, has_json in BENCHMARKS:
            print(f"running {module} ...", flush=True)
            started = dt.datetime.now(dt.timezone.utc)
            arguments = [*ARGUMENTS.get(module, []), *extra]
            output, data = run(
                module, Path(tmp) / f"{module}.json" if has_json else None, arguments
            )
            took = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
            if data is not None:
                figures[module] = data
            command = " ".join(["python -m", module, *arguments])
            sections.append(f"## {title}\n\n`{command}` ({took / 60:.0f} min)\n\n{output}\n")
    FIGURES.write_text(json.dumps(figures, indent=1) + "\n")
    drew = draw_chart(figures)
    head = [
        "# Benchmarks",
        "",
        f"Measured on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC with "
        f"`.venv/bin/python -m benchmarks.report{''.join(' ' + a for a in extra)}` "
        "(which runs each command below; "
        "the raw figures per round are in benchmarks.json).",
        "Timings are from one run on a small shared machine: read them as orders of",
        "magnitude and ratios, not as guarantees.",
        "",
        *machine(),
        "",
    ]
    if "benchmarks.beat" in figures:
        head += [
            "## Headline: failover, ours / theirs",
            "",
            headline(
                figures["benchmarks.beat"],
                figures.get("benchmarks.workers"),
                figures.get("benchmarks.fast_failover"),
            ),
            "",
        ]
    if drew:
        head += ["![failover per round, per system](failover.png)", ""]
    (DOCS / "benchmarks.md").write_text("\n".join(head) + "\n" + "\n".join(sections))
    print(f"wrote {DOCS / 'benchmarks.md'}, {FIGURES}" + (" and failover.png" if drew else ""))


if __name__ == "__main__":
    main()
