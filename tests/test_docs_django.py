"""The Django page's files, as written: its settings and its proj/celery.py run a real beat.

The page includes docs/examples/django/ (settings.py, proj/celery.py and the
refusal line); this test runs those same files. Only the Redis address of
the settings is pointed at this test's redis-server; the rest of a Django
project the page does not show (database, installed apps) is added.
A beat started as the page says leads beat's election; ``-S django``
stops with exactly the line the page prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = ROOT / "docs" / "examples" / "django"
PAGE = ROOT / "docs" / "django.md"

PROJECT_REST = """
# The rest of a Django project, which the page leaves to the reader.
SECRET_KEY = "docs-test-only"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""


def test_the_django_page_includes_the_files_this_test_runs():
    """What the page shows is what runs below: each file is included, not retyped."""
    page = PAGE.read_text()
    for name in ("proj/settings.py", "proj/celery.py", "unled-beat-refusal.txt"):
        assert f"examples/django/{name}" in page, name


def test_the_django_page_runs_as_written(redis_server, tmp_path):
    """Its settings and proj/celery.py run a led beat; ``-S django`` stops with its line."""
    settings = (EXAMPLE / "proj" / "settings.py").read_text()
    celery_module = (EXAMPLE / "proj" / "celery.py").read_text()
    refusal = (EXAMPLE / "unled-beat-refusal.txt").read_text()
    assert settings.startswith("# settings.py") and celery_module.startswith("# proj/celery.py")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "__init__.py").write_text("")
    base = f"redis://127.0.0.1:{redis_server.port}"
    (project / "settings.py").write_text(
        settings.replace("redis://127.0.0.1:6379", base)
        + PROJECT_REST.format(db=str(tmp_path / "db.sqlite3"))
    )
    (project / "celery.py").write_text(celery_module)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DJANGO_SETTINGS_MODULE": "proj.settings"}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=120,
    )

    log = tmp_path / "beat.log"
    with log.open("wb") as out:
        led = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", "beat", "-l", "info"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        # The start line comes first; "holds election" once the lease is taken (a store round
        # trip later, which a loaded machine can stretch): wait for it, then check it.
        while "holds election 'proj.beat'" not in log.read_text(errors="replace"):
            assert led.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        assert "holds election 'proj.beat'" in log.read_text(), log.read_text()[-3000:]
    finally:
        led.terminate()
        led.wait(30)

    unled = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "proj", "beat", "-S", "django", "-l", "info"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unled.returncode != 0, unled.stdout[-2000:] + unled.stderr[-2000:]
    assert refusal.strip() in unled.stderr.splitlines(), unled.stderr[-3000:]
    assert "Traceback" not in unled.stderr
