"""sqlite:// URLs follow SQLAlchemy's rule; a relative URL whose absolute twin exists is refused."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from celery_leader.exceptions import ConfigurationError
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.stores.sqlite_url import sqlite_path


def test_three_slashes_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    """sqlite:///leader.db is ./leader.db, as in SQLAlchemy."""
    monkeypatch.chdir(tmp_path)
    name = f"leader-{uuid.uuid4().hex}.db"
    assert sqlite_path(f"sqlite:///{name}") == tmp_path / name
    (tmp_path / "sub").mkdir()
    assert sqlite_path(f"sqlite:///sub/{name}") == tmp_path / "sub" / name


def test_four_slashes_are_absolute(tmp_path, monkeypatch):
    """sqlite:////abs/path.db is /abs/path.db whatever the working directory."""
    monkeypatch.chdir("/")
    assert sqlite_path(f"sqlite:///{tmp_path}/leader.db") == tmp_path / "leader.db"


def test_the_store_writes_where_the_url_says_and_logs_it(tmp_path, monkeypatch, caplog):
    """A relative URL creates the file in the working directory and logs its absolute path."""
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="celery_leader.stores.sqlite"):
        store = open_store("sqlite:///relative.db", timeout=1)
    try:
        holder = Holder.for_this_process("node-a")
        assert store.acquire("election", holder, 5.0).acquired
    finally:
        store.close()
    assert (tmp_path / "relative.db").exists()
    assert f"SQLite lease store file {tmp_path / 'relative.db'}" in caplog.text


def test_a_relative_url_whose_absolute_twin_exists_is_refused(tmp_path, monkeypatch):
    """Old releases read sqlite:///<tmp>/x.db as /<tmp>/x.db: an existing twin stops the start."""
    # The twin of "sqlite:///<rel>" is "/<rel>": make <rel> the tmp path without its slash.
    twin = tmp_path / "old.db"
    twin.write_bytes(b"")
    relative = str(twin).lstrip("/")
    workdir = tmp_path / "work"
    (workdir / Path(relative).parent).mkdir(parents=True)
    monkeypatch.chdir(workdir)
    with pytest.raises(ConfigurationError) as caught:
        sqlite_path(f"sqlite:///{relative}")
    message = str(caught.value)
    assert message.startswith(f"leader_backend_url='sqlite:///{relative}' is not allowed")
    assert f"'sqlite:///{twin}'" in message


def test_the_twin_is_not_refused_when_it_is_the_same_file(tmp_path, monkeypatch):
    """From the root directory the relative URL and its twin are one file: nothing to refuse."""
    twin = tmp_path / "same.db"
    twin.write_bytes(b"")
    monkeypatch.chdir("/")
    assert sqlite_path(f"sqlite:///{str(twin).lstrip('/')}") == twin


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///", "sqlite://host/leader.db", "sqlite:///:memory:"]
)
def test_urls_without_a_file_are_refused(url):
    """No file, a host part, or :memory: give one line naming the setting and the two forms."""
    with pytest.raises(ConfigurationError, match=r"^leader_backend_url=.*sqlite:////absolute"):
        sqlite_path(url)
