"""The README's Django section, as written: its settings and its proj/celery.py run a real beat.

The blocks are read from README.md, not retyped. Only the Redis address of
the settings is pointed at this test's redis-server; the rest of a Django
project the section does not show (database, installed apps) is added.
A beat started as the section says leads beat's election; ``-S django``
stops with exactly the line the section prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROJECT_REST = """
# The rest of a Django project, which the README leaves to the reader.
SECRET_KEY = "readme-test-only"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_django_section_runs_as_written(redis_server, tmp_path):
    django = section("Django")
    settings, celery_module = blocks(django, "python")
    (refusal,) = blocks(django, "text")
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
