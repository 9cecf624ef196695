"""A real worker serves its election metrics over HTTP."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("celery_leader_")
    }


def test_a_worker_serves_its_metrics(cluster_for):
    """leader_metrics_port: the leading worker reports is_leader 1 and its token over HTTP."""
    cluster = cluster_for("redis")
    port = free_port()
    cluster.env["LEADER_METRICS_PORT"] = str(port)
    cluster.start(1)
    cluster.leader_worker()
    code, status = cluster.leader_status()
    assert code == 0
    deadline = time.monotonic() + 5
    samples = scrape(port)
    while samples.get("celery_leader_is_leader") != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        samples = scrape(port)
    assert samples["celery_leader_is_leader"] == 1
    assert samples["celery_leader_token"] == float(status["leader"]["token"])
    assert samples["celery_leader_elections_total"] == 1
