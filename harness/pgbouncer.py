"""A private PgBouncer in front of a test's PostgreSQL server (Debian's ``pgbouncer``).

:class:`PgBouncer` listens on a free loopback port and pools connections to
one :class:`~harness.servers.PostgresServer` in the mode given
(``transaction``, ``statement`` or ``session``), with trust auth. PgBouncer
refuses to run as root: as root it runs as the ``postgres`` user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.servers import PostgresServer, ServerProcess, free_port, wait_for_port

BINARY = "/usr/sbin/pgbouncer"


class PgBouncer(ServerProcess):
    """One pgbouncer process, pooling to *server*'s ``postgres`` database in *mode*."""

    def __init__(self, server: PostgresServer, mode: str, *, pool_size: int = 2) -> None:
        self.server = server
        self.mode = mode
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="celery-leader-pgbouncer-"))
        self.pool_size = pool_size
        self.proc = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PgBouncer:
        if not Path(BINARY).exists():
            raise RuntimeError(f"{BINARY} is missing: install pgbouncer (./run.sh test does)")
        (self.root / "users.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"postgres = host={self.server.host} port={self.server.port} dbname=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {self.mode}\ndefault_pool_size = {self.pool_size}\n"
            f"logfile = {self.root / 'pgbouncer.log'}\npidfile = {self.root / 'pgbouncer.pid'}\n"
            # The store's connections set these at start; PgBouncer must let them through.
            "ignore_startup_parameters = extra_float_digits,options,application_name\n"
        )
        command = [BINARY, str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            for path in self.root.iterdir():
                shutil.chown(path, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        with open(self.root / "stderr.log", "wb") as stderr:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        wait_for_port(self.proc, self.port, "pgbouncer", timeout=15)
        return self

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.root, ignore_errors=True)
