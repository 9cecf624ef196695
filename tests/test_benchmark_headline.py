"""The benchmark report's headline: ratios ours / theirs from raw figures (pure logic)."""

from __future__ import annotations

from benchmarks.chart import series
from benchmarks.headline import headline


def beat_figures() -> dict:
    def row(label, ttl, crash, graceful):
        return {"label": label, "ttl": ttl, "crash": crash, "graceful": graceful}

    return {
        "cap": 60.0,
        "beat": {
            "celery-leader, ttl 3 s": row("celery-leader", 3.0, [2.0, 3.0, 2.5], [0.5, 0.5]),
            "RedBeat, tuned, ttl 3 s": row("RedBeat, tuned", 3.0, [4.0, 5.0, 6.0], [2.0, 2.0]),
            "celery-leader, ttl 10 s": row("celery-leader", 10.0, [9.0], [0.6]),
            "RedBeat, tuned, ttl 10 s": row("RedBeat, tuned", 10.0, [12.0], [1.2]),
            "RedBeat, defaults": row("RedBeat, defaults", None, [None], [None]),
        },
    }


def cells(table: str, system: str) -> list[str]:
    for line in table.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if parts[0] == system:
            return parts[1:]
    raise AssertionError(f"no row {system!r} in\n{table}")


def test_ratio_is_our_median_over_theirs_per_ttl_and_kind():
    table = headline(beat_figures(), None)
    # columns: ttl 3 crash, ratio, ttl 3 graceful, ratio, ttl 10 crash, ratio, ...
    assert cells(table, "RedBeat, tuned") == [
        "5.00 s", "0.50", "2.00 s", "0.25", "12.00 s", "0.75", "1.20 s", "0.50",
    ]  # fmt: skip
    assert cells(table, "celery-leader beat")[:2] == ["2.50 s", ""]


def test_a_peer_at_the_cap_is_shown_as_beyond_it_and_stands_in_every_ttl_column():
    """A round that reached the cap is null in the JSON; its median is beyond the cap."""
    table = headline(beat_figures(), None)
    row = cells(table, "RedBeat, defaults")
    assert row[0] == "> 60 s" and row[1] == f"< {2.5 / 60:.2f}"
    assert row[4] == "> 60 s" and row[5] == f"< {9.0 / 60:.2f}"


def test_workers_row_and_chart_series_come_from_the_workers_figures():
    workers = {"workers": {"3": {"crash": [2.1, 2.3], "graceful": [0.02]}}}
    table = headline(beat_figures(), workers)
    assert cells(table, "celery-leader workers (first leader task)")[:3] == ["2.20 s", "", "0.02 s"]
    labels = [s.label for s in series(beat_figures(), workers)]
    assert labels[0] == "celery-leader workers, ttl 3 s"
    assert labels[-1] == "RedBeat, defaults"


def test_fast_failover_rows_come_from_its_figures_per_store():
    workers = {"workers": {"3": {"crash": [2.1, 2.3], "graceful": [0.02]}}}
    fast = {"redis": {"3": [0.3, 0.4, 0.35], "10": [0.33]}, "sqlite": {"3": [0.31]}}
    table = headline(beat_figures(), workers, fast)
    assert cells(table, "celery-leader workers, fast failover (redis)") == [
        "0.35 s", "", "as above", "", "0.33 s", "", "as above", "",
    ]  # fmt: skip
    assert cells(table, "celery-leader workers, fast failover (sqlite)")[4] == "n/a"
    rows = series(beat_figures(), workers, fast)
    fast_rows = [s for s in rows if "fast failover" in s.label]
    assert [s.label for s in fast_rows] == [
        "celery-leader workers, fast failover, redis, ttl 3 s",
        "celery-leader workers, fast failover, redis, ttl 10 s",
        "celery-leader workers, fast failover, sqlite, ttl 3 s",
    ]
    assert fast_rows[0].crash == [0.3, 0.4, 0.35]
    assert fast_rows[0].graceful == []


def test_beat_fast_failover_rows_come_from_its_first_sends_and_are_no_store():
    """Under "beat" the JSON holds beat's figures per store: a beat row each, no store "beat"."""
    workers = {"workers": {"3": {"crash": [2.1, 2.3], "graceful": [0.02]}}}
    beat_found = {"takeover": [0.3, 0.34], "first_send": [0.4, 0.44], "expired": 0, "twice": 0}
    fast = {"redis": {"3": [0.3, 0.4, 0.35]}, "beat": {"postgres": {"3": beat_found}}}
    table = headline(beat_figures(), workers, fast)
    assert cells(table, "celery-leader beat, fast failover (postgres)")[:3] == [
        "0.42 s", "", "as above",
    ]  # fmt: skip
    assert "fast failover (beat)" not in table
    systems = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("|")]
    beat_row = systems.index("celery-leader beat")
    assert systems[beat_row + 1] == "celery-leader beat, fast failover (postgres)"
    rows = series(beat_figures(), workers, fast)
    fast_rows = [s for s in rows if "fast failover" in s.label]
    assert [s.label for s in fast_rows] == [
        "celery-leader workers, fast failover, redis, ttl 3 s",
        "celery-leader beat, fast failover, postgres, ttl 3 s",
    ]
    assert fast_rows[1].crash == [0.4, 0.44]
    labels = [s.label for s in rows]
    assert labels.index(fast_rows[1].label) == labels.index("celery-leader beat, ttl 10 s") + 1
