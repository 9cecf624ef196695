"""Shared fixtures: real redis-server processes, stores, and a history checker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import LeaseStore
from harness.servers import RedisServer
from tests.store_matrix import QUICK, STORES, RunningStore

#: Files whose tests must stay on one pytest-xdist worker: they share a module-scoped
#: fixture (started once per worker that runs them), or write the same files.
XDIST_GROUPS = {
    "tests/integration/test_example_project.py": "example_project",  # its workers
    "tests/beat/test_django_beat_state.py": "django",  # Django, configured once a process
    "tests/package/test_install.py": "install",  # each builds a wheel in the source tree
    # The demo's tests find its processes by listing the machine's; the election tests
    # run the demo's lease nodes, which those listings would see.
    "tests/test_demo.py": "demo_processes",
    "tests/test_demo_beat.py": "demo_processes",
    "tests/lease/test_election.py": "demo_processes",
}

#: Tests (node id prefixes) that bound a time tightly enough that the load of other
#: tests beside them could break it: marked ``serial``, run.sh runs them in a pass of
#: their own after the parallel one.
SERIAL = (
    # 50 s of faults at a 2 s ttl: the run watchdog must kill within the lease's margin of a
    # deadline while its worker's main process is stopped; five test processes on two cores
    # beside it delayed that kill past the margin once (a run in flight across a term change).
    "tests/chaos/test_chaos.py::test_short_chaos_run",
    "tests/integration/test_beat.py::test_sigterm_sending_beat_hands_over_within_two_seconds",
    "tests/integration/test_term_end.py::test_main_process_killed_children_stop_at_once",
    "tests/integration/test_workers.py::test_lease_lost_cancel_is_seen_in_time",
    "tests/integration/test_workers.py::test_step_down_hands_over_without_loss",
    "tests/stores/test_azure_blob.py::test_one_leader_and_immediate_handover_on_release",
    "tests/stores/test_redis_faults.py::test_acquire_with_lost_reply_is_adopted",
    "tests/stores/test_postgres_lifeline.py::test_sigkill_ends_the_lifeline_within_a_second",
    "tests/lease/test_lease_deadlines.py::test_bounded_caller_returns_on_time_while_the_call_hangs",
    "tests/term_end/test_term_end.py::test_watchdog_process_ends_runs_and_exits_with_its_worker",
    # Kills within half a second of a deadline or a revocation, by a sleeping watchdog.
    "tests/term_end/test_watchdog_sleep.py",
    # Each send within a period plus a ttl plus 5 s of a fault, with Django starting up.
    "tests/integration/test_django_beat.py::test_django_celery_beat_fails_over_without_early",
    # A dead worker's elections move within ttl + 4 s.
    "tests/integration/test_named_elections.py::test_six_elections_spread_over_three_workers",
    # A beat loading thousands of entries must keep ticking (its liveness) within its ttl.
    "tests/beat/test_django_beat_state.py::test_taking_over_thousands_of_entries_keeps_the_lease",
    # A status command that starts within 1.5 renew intervals of an acquire.
    "tests/test_cli_status.py::test_status_shows_the_last_renewal_and_marks_a_silent_holder",
    # The next leader must keep its lease from a step-down until a 4 s countdown has run.
    "tests/integration/test_worker_config.py::test_eta_leader_message_is_handed_back_on_step_down",
    # The old leader must stop within ttl + 0.5 s (ttl 1 s) of its database file's replacement.
    "tests/stores/test_sqlite_faults.py::test_file_replaced_under_a_leader_never_splits_the_election",
    "tests/stores/test_sqlite_faults.py::test_backup_moved_in_after_a_process_recreated_the_file",
    # A watchdog continued 0.1 s after its worker's main process must pass within 0.5 s.
    "tests/integration/test_run_safety.py::test_a_watchdog_stopped_with_its_worker_is_not_taken",
    # A handover within 1 s of the release, and a first leader, in a demo of four processes.
    "tests/test_demo.py::test_quick_demo_shows_failover_and_handover",
    # Lifelines: a leader confirms its lifeline every 50 ms and pauses past 0.25 s without
    # an answer; a follower takes over 0.3 s after a death. Load beside them stretches both.
    # The whole file: its worker and its beat tests (a killed, a stopped beat; a beat's
    # lifeline connection killed) alike.
    "tests/integration/test_fast_failover.py",
    # A live Prometheus: six step-downs within a 15 s window, beat stalls timed against its
    # lease, alerts whose scaled waits are a second or two.
    "tests/integration/test_prometheus_live.py::test_every_alert_fires_on_its_fault_and_clears",
    "tests/lease/test_lifeline_manager.py::test_the_first_term_waits_for_the_first_confirmation",
    "tests/stores/test_sqlite_lifeline.py::test_a_lifeline_reads_kept_while_its_process_lives",
    "tests/stores/test_sqlite_lifeline.py::test_a_child_living_on_after_its_parent_was_killed",
    "tests/stores/test_sqlite_lifeline.py::test_a_follower_leads_within_a_second_of_its_leaders",
    "tests/stores/test_postgres_lifeline.py::test_a_killed_leader_is_taken_over_long_before",
    "tests/stores/test_redis_lifeline.py::test_a_store_that_answers_late_pauses_the_term",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup`` that keeps each file of XDIST_GROUPS on one worker.

    xdist's own loadgroup reads the ``xdist_group`` marks through node ids that
    pytest 9.2 no longer lets it change (pytest-xdist issue 1386): the groups
    are then silently ignored. This scheduler finds them by file name instead.
    """
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = XDIST_GROUPS.get(nodeid.split("::", 1)[0])
            return f"group:{group}" if group is not None else super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark XDIST_GROUPS and SERIAL, before any pytest_collection_modifyitems reads marks
    (xdist's, which names the groups; ``-m``'s)."""
    group = XDIST_GROUPS.get(item.nodeid.split("::", 1)[0])
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))
    if item.nodeid.startswith(SERIAL):
        item.add_marker(pytest.mark.serial)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check SERIAL in the serial pass; under pytest-xdist, send the slow tests out first."""
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if whole and config.option.markexpr == "serial":  # run.sh's pass: a renamed test is lost
        missing = [name for name in SERIAL if not any(i.nodeid.startswith(name) for i in items)]
        if missing:
            raise pytest.UsageError(f"tests/conftest.py SERIAL names no test: {missing}")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        # The longest first, so that no worker starts one near the end while the others
        # idle (run.sh keeps this order: --no-loadscope-reorder). The sort is stable.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, killed after the test."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture(params=QUICK)
def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The URL of a fresh, real store of each kind that starts quickly (tests/store_matrix.py)."""
    with STORES[request.param].run(tmp_path, monkeypatch) as store:
        yield store.url


@pytest.fixture(params=list(STORES))
def running_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningStore]:
    """A fresh store of every kind in tests/store_matrix.py, Azure Blob (Azurite) included."""
    with STORES[request.param].run(tmp_path, monkeypatch) as store:
        yield store


@pytest.fixture
def any_store_url(running_store: RunningStore) -> str:
    """The URL of a fresh store of every kind in tests/store_matrix.py."""
    return running_store.url


@pytest.fixture
def lease_ttl(running_store: RunningStore) -> float:
    """A lease length the store accepts (Azure: 15..60 s)."""
    return running_store.kind.lease_ttl


@pytest.fixture
def open_stores() -> Iterator[list[LeaseStore]]:
    """Stores opened in a test, closed after it."""
    stores: list[LeaseStore] = []
    yield stores
    for store in stores:
        store.close()


@pytest.fixture
def make_store(any_store_url: str, open_stores: list[LeaseStore]):  # type: ignore[no-untyped-def]
    """Open another client of the test's store."""

    def make(timeout: float = 2.0) -> LeaseStore:
        store = open_store(any_store_url, timeout=timeout)
        open_stores.append(store)
        return store

    return make


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_leader")
