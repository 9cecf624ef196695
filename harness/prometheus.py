"""A real Prometheus server for tests and the operations chart.

``PrometheusServer`` runs Debian's ``prometheus`` binary on a free loopback
port with a private data directory. It scrapes the targets a test names
(each with a ``process`` label: ``w1``, ``beat1``), through a file that
Prometheus watches, so targets can come and go while it runs. It loads
alert rules and answers PromQL through its HTTP API.

``scaled_rules`` copies a rules file with every duration divided by a
factor (``for: 5m`` and ``[15m]`` become ``for: 5s`` and ``[15s]`` at 60), so
that a test sees an alert built for minutes fire and clear in seconds: the
expressions, labels and thresholds are the shipped ones.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from harness.servers import ServerProcess, free_port, require_binary, wait_for_port

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# A duration in a range selector ([5m], [15m:1m]) or after "for:".
_IN_RULES = re.compile(r"(\[|:|for:\s*)(\d+(?:ms|s|m|h|d))(?=[\]:\s]|$)", re.MULTILINE)


def seconds(duration: str) -> float:
    """The seconds of a Prometheus duration such as ``90s``, ``5m`` or ``1h30m``."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _SECONDS[u] for n, u in parts)


def scaled_rules(source: Path, target: Path, factor: float, least: float = 1.0) -> Path:
    """Write *source* to *target* with every duration divided by *factor* (at least *least* s).

    Range windows stay at least *least* seconds so that ``rate`` and
    ``increase`` still see two scrapes.
    """

    def scale(match: re.Match[str]) -> str:
        scaled = max(seconds(match.group(2)) / factor, least)
        return f"{match.group(1)}{round(scaled * 1000)}ms"

    target.write_text(_IN_RULES.sub(scale, source.read_text(encoding="utf-8")), encoding="utf-8")
    return target


class PrometheusServer(ServerProcess):
    """``prometheus`` on 127.0.0.1, scraping every *scrape_interval* seconds.

    Rules are evaluated at the same interval. :meth:`scrape` sets the
    targets; :meth:`query`, :meth:`query_range` and :meth:`alerts` read.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        scrape_interval: float = 0.5,
        rule_files: tuple[Path, ...] = (),
        port: int | None = None,
    ) -> None:
        self.binary = require_binary("prometheus")
        self.workdir = workdir / f"prometheus-{time.monotonic_ns()}"
        self.workdir.mkdir(parents=True)
        self.port = port or free_port()
        self.scrape_interval = scrape_interval
        self.rule_files = rule_files
        self.targets_file = self.workdir / "targets.json"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        interval = f"{round(self.scrape_interval * 1000)}ms"
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "celery-leader",
                    "file_sd_configs": [
                        {"files": [str(self.targets_file)], "refresh_interval": "1s"}
                    ],
                }
            ],
        }
        self.targets_file.write_text("[]", encoding="utf-8")
        # JSON is YAML: no YAML writer needed.
        (self.workdir / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
        log = open(self.workdir / "prometheus.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=log,
            cwd=self.workdir,
        )
        log.close()
        wait_for_port(self.proc, self.port, "prometheus", 30)
        self._wait(lambda: self._get("/-/ready", raw=True) is not None, 30, "prometheus ready")
        return self

    def scrape(self, targets: dict[str, int]) -> None:
        """Scrape exactly *targets* (process label -> port on 127.0.0.1) from now on."""
        groups = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"process": process}}
            for process, port in targets.items()
        ]
        staged = self.targets_file.with_suffix(".tmp")
        staged.write_text(json.dumps(groups), encoding="utf-8")
        staged.replace(self.targets_file)  # one rename: Prometheus never reads half a file

    def wait_scraping(self, processes: set[str], timeout: float = 30) -> None:
        """Block until every one of *processes* was scraped successfully."""

        def all_up() -> bool:
            up = {s["metric"].get("process") for s in self.query("up == 1")}
            return processes <= up

        self._wait(all_up, timeout, f"prometheus scraping {sorted(processes)}")

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) *expr* gives at *at* (now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self._api("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The range vector *expr* gives from *start* to *end* every *step* seconds."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return list(self._api("/api/v1/query_range", params)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (``labels``, ``state``, ...)."""
        return list(self._api("/api/v1/alerts", {})["alerts"])

    def firing(self) -> dict[str, list[dict[str, str]]]:
        """Alert name -> the label sets of its firing alerts."""
        found: dict[str, list[dict[str, str]]] = {}
        for alert in self.alerts():
            if alert["state"] == "firing":
                found.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return found

    def rule_health(self) -> dict[str, str]:
        """Rule name -> its health after the last evaluation (``ok``, ``err``, ``unknown``)."""
        data = self._api("/api/v1/rules", {})
        return {
            rule["name"]: rule["health"]
            + (f": {rule['lastError']}" if rule.get("lastError") else "")
            for group in data["groups"]
            for rule in group["rules"]
        }

    def _api(self, path: str, params: dict[str, str]) -> Any:
        answer = self._get(f"{path}?{urllib.parse.urlencode(params)}")
        if answer is None or answer.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {answer}")
        return answer["data"]

    def _get(self, path: str, raw: bool = False) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if raw:
                return None
        except OSError:
            return None
        return body if raw else json.loads(body)

    @staticmethod
    def _wait(predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise RuntimeError(f"not within {timeout:g} s: {what}")
