"""Beat's own state has two writers (send marks on beat's loop, the view and run-now
records on the steering thread): on a store that rewrites the whole state per write
(Azure's blob), neither may lose the other's key."""

from __future__ import annotations

import threading
import uuid

from celery import Celery

from celery_leader.beat.scheduler import BeatElection
from celery_leader.settings import app_settings
from celery_leader.stores.base import Holder
from harness.servers import AzuriteServer

WRITES = 25


def test_concurrent_own_state_writes_keep_every_key(tmp_path, monkeypatch) -> None:
    server = AzuriteServer(tmp_path).start()
    try:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string)
        app = Celery(f"b{uuid.uuid4().hex[:8]}", broker="memory://")
        app.conf.leader_backend_url = f"azureblob://c{uuid.uuid4().hex[:12]}/leases"
        election = BeatElection(app_settings(app, fresh=True).beat_election)
        try:
            holder = Holder.for_this_process("beat-test")
            name = election.settings.name
            assert election.store.acquire(name, holder, 15.0).acquired

            def write(prefix: str) -> None:
                for i in range(WRITES):
                    assert election._set_own_state(holder.lease_id, f"{prefix}{i}", "{}")

            threads = [
                threading.Thread(target=write, args=(prefix,))
                for prefix in ("mark-", "celery-leader:ran:")
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            state = election.store.get_state(name)
            missing = [
                f"{prefix}{i}"
                for prefix in ("mark-", "celery-leader:ran:")
                for i in range(WRITES)
                if f"{prefix}{i}" not in state
            ]
            assert not missing, f"writes lost: {missing}"
        finally:
            election.stop()
    finally:
        server.stop()
