"""Run every benchmark and write docs/benchmarks.md with a failover chart.

Run from the repository root:  .venv/bin/python -m benchmarks.report

Needs the ``bench`` extra (matplotlib for the chart, the peers RedBeat and
single-beat for the beat comparison). Each benchmark prints a markdown table;
this script keeps those tables verbatim, adds the machine, the versions and
the command, and draws the crash failover rows (median and worst) as a PNG.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BENCHMARKS = [
    ("Lease core (Redis)", ["benchmarks.lease"]),
    ("Workers end to end (Redis broker and store)", ["benchmarks.workers"]),
    ("Azure Blob store (Azurite)", ["benchmarks.azure"]),
    ("Beat failover, side by side with RedBeat and single-beat", ["benchmarks.beat"]),
    ("Per-call cost, side by side with celery-once and celery-singleton", ["benchmarks.gate"]),
]
NUMBER = re.compile(r"^(?:[\d.]+)(?: s)?$")


def failover_rows(markdown: str) -> list[tuple[str, float, float]]:
    """(label, median, worst) of every crash-failover row in the benchmark tables.

    Rows of the beat table (header "crash: median | p90 | worst") are all
    crash rows; elsewhere, rows whose label says crash, failover or takeover.
    """
    rows, beat_table, section = [], False, ""
    for line in markdown.splitlines():
        if line.startswith("## "):
            section = line[3:].split("(")[0].split(",")[0].strip()
        if not line.startswith("|"):
            beat_table = beat_table and bool(line.strip())
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "crash: median" in line:
            beat_table = True
            continue
        numbers = [float(c.removesuffix(" s")) for c in cells if NUMBER.match(c)]
        if not numbers:
            continue
        if beat_table and len(numbers) >= 3:
            rows.append((f"beat: {cells[0]} ({cells[1]})"[:58], numbers[0], numbers[2]))
        elif (
            not beat_table
            and re.search(r"crash|failover|takeover", cells[0], re.I)
            and not cells[0].startswith("of which")
            and len(numbers) >= 2
        ):
            rows.append((f"{section}: {cells[0]}"[:58], numbers[0], numbers[1]))
    return rows


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


def chart(rows: list[tuple[str, float, float]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [label for label, _, _ in rows]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh(
        [i + 0.2 for i in y], [w for _, _, w in rows], height=0.4, label="worst", color="#d98c8c"
    )
    ax.barh(
        [i - 0.2 for i in y], [m for _, m, _ in rows], height=0.4, label="median", color="#4c72b0"
    )
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from SIGKILL to the first work of the new holder")
    ax.set_title("Crash failover, this machine, one run")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    DOCS.mkdir(exist_ok=True)
    if "--chart-only" in sys.argv:
        rows = failover_rows((DOCS / "benchmarks.md").read_text())
        chart(rows, DOCS / "failover.png")
        print(f"drew {len(rows)} rows into {DOCS / 'failover.png'}")
        return
    sections = []
    for title, module in BENCHMARKS:
        print(f"running {module[0]} ...", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", *module], cwd=ROOT, capture_output=True, text=True, check=False
        )
        output = proc.stdout.strip() or proc.stderr.strip()[-2000:]
        sections.append(f"## {title}\n\n`python -m {' '.join(module)}`\n\n{output}\n")
    png = DOCS / "failover.png"
    drew = chart(failover_rows("\n".join(sections)), png)
    head = [
        "# Benchmarks",
        "",
        f"Measured on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC with "
        "`.venv/bin/python -m benchmarks.report` (which runs each command below).",
        "Timings are from one run on a small shared machine: read them as orders of",
        "magnitude and ratios, not as guarantees.",
        "",
        *machine(),
        "",
    ]
    if drew:
        head += ["![crash failover per system](failover.png)", ""]
    (DOCS / "benchmarks.md").write_text("\n".join(head) + "\n" + "\n".join(sections))
    print(f"wrote {DOCS / 'benchmarks.md'}" + (f" and {png}" if drew else ""))


if __name__ == "__main__":
    main()
