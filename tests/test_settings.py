"""Settings: defaults, and one clear error per bad value naming key and allowed range."""

from __future__ import annotations

import re

import pytest

from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import load_settings


def conf(**kwargs):
    base = {"broker_url": "redis://127.0.0.1:6379/0"}
    base.update(kwargs)
    return base


def test_defaults_follow_the_contract():
    """ttl 5, renew ttl/3, name from the app, queue <name>.leader, store = Redis broker."""
    settings = load_settings(conf(), "proj")
    assert settings.timing.ttl == 5.0
    assert settings.timing.renew_interval == pytest.approx(5 / 3)
    assert settings.name == "proj"
    assert settings.queue == "proj.leader"
    assert settings.backend_url == "redis://127.0.0.1:6379/0"


def test_name_defaults_to_celery_without_main():
    """Without app.main the election is called "celery"."""
    assert load_settings(conf(), None).name == "celery"


def test_beat_election_has_its_own_name():
    """The beat election is "<leader_name>.beat"."""
    assert load_settings(conf(leader_name="x"), None, name_suffix=".beat").name == "x.beat"


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"leader_lease_ttl": 0}, ["leader_lease_ttl=0", "> 0"]),
        ({"leader_lease_ttl": -3}, ["leader_lease_ttl=-3", "> 0"]),
        ({"leader_lease_ttl": "soon"}, ["leader_lease_ttl='soon'", "number"]),
        ({"leader_lease_ttl": float("nan")}, ["leader_lease_ttl=nan", "finite"]),
        (
            {"leader_lease_ttl": 6, "leader_renew_interval": 3},
            ["leader_renew_interval=3", "< ttl/2 (3)"],
        ),
        ({"leader_renew_interval": 0}, ["leader_renew_interval=0", "> 0"]),
        ({"leader_lease_margin": 4}, ["leader_lease_margin=4", "ttl/4"]),
        (
            {"leader_store_timeout": 10},
            ["leader_store_timeout=10", "< ttl - margin - renew_interval"],
        ),
        (
            {"leader_backend_url": "mongodb://h/db"},
            ["leader_backend_url", "'mongodb'", "redis://", "sqlite://"],
        ),
        ({"leader_name": "  "}, ["leader_name", "non-empty"]),
    ],
)
def test_bad_values_name_key_value_and_range(overrides, fragments):
    """Each bad value raises one ConfigurationError with key, value and what is allowed."""
    with pytest.raises(ConfigurationError) as info:
        load_settings(conf(**overrides), "proj")
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_non_redis_broker_without_backend_is_an_error():
    """With RabbitMQ as broker the store URL is required, and the error says so."""
    with pytest.raises(ConfigurationError, match="leader_backend_url is not set"):
        load_settings({"broker_url": "amqp://guest:guest@127.0.0.1:5672//"}, "proj")


def test_errors_mask_passwords():
    """A password in a bad URL never appears in the error."""
    with pytest.raises(ConfigurationError) as info:
        load_settings(conf(leader_backend_url="bogus://user:topsecret@h/0"), "proj")
    assert "topsecret" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        load_settings({"broker_url": "amqp://guest:brokersecret@h//"}, "proj")
    assert "brokersecret" not in str(info.value)


def test_sqlite_needs_an_existing_directory(tmp_path):
    """A SQLite URL in a missing directory is refused at start, naming the setting."""
    from celery_leader.stores import open_store

    with pytest.raises(ConfigurationError, match="leader_backend_url"):
        open_store(f"sqlite:///{tmp_path}/missing/leader.db", timeout=1)


class _DjangoStyleSettings:
    """Settings as Django holds them, read by Celery under namespace="CELERY"."""

    CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    CELERY_LEADER_LEASE_TTL = "soon"


def test_errors_spell_the_key_as_written_under_a_namespace():
    """Under Django's namespace the error names CELERY_LEADER_LEASE_TTL, the key the user wrote."""
    from celery import Celery

    from celery_leader.settings import settings_for_app

    app = Celery("proj")
    app.config_from_object(_DjangoStyleSettings, namespace="CELERY")
    with pytest.raises(ConfigurationError) as caught:
        settings_for_app(app)
    assert str(caught.value).startswith("CELERY_LEADER_LEASE_TTL='soon' is not allowed")
    assert "leader_lease_ttl" not in str(caught.value)


def test_namespaced_settings_are_read():
    """CELERY_LEADER_* keys take effect under the namespace."""
    from celery import Celery

    from celery_leader.settings import settings_for_app

    app = Celery("proj")
    app.config_from_object(_DjangoStyleSettings, namespace="CELERY")
    app.conf.CELERY_LEADER_LEASE_TTL = 7
    app.conf.CELERY_LEADER_NAME = "billing"
    settings = settings_for_app(app)
    assert settings.timing.ttl == 7.0
    assert settings.name == "billing"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("leader_metrics", "no", "leader_metrics='no' is not allowed: it must be True or False"),
        ("leader_queue", 5, "leader_queue=5 is not allowed"),
        ("leader_queue", "  ", "leader_queue='  ' is not allowed"),
        ("leader_backend_url", 5, "leader_backend_url=int is not allowed"),
        ("leader_azure_watch_interval", 0, "leader_azure_watch_interval=0 is not allowed"),
        ("leader_azure_watch_interval", "x", "leader_azure_watch_interval='x' is not allowed"),
        # Beat's settings are checked at worker start too: a worker may run beat (-B).
        ("leader_beat_standby", "sometimes", "leader_beat_standby='sometimes' is not allowed"),
        ("leader_beat_missed_default", "twice", "leader_beat_missed_default='twice'"),
        ("leader_beat_missed", {"tick": "twice"}, "leader_beat_missed['tick']='twice'"),
        ("leader_beat_missed", ["tick"], "leader_beat_missed=['tick'] is not allowed"),
        ("leader_beat_scheduler", 5, "leader_beat_scheduler=5 is not allowed"),
        ("leader_azure_account_url", "myaccount", "leader_azure_account_url='myaccount'"),
        ("leader_azure_connection_string", 5, "leader_azure_connection_string (int)"),
        ("leader_tasks", 5, "leader_tasks=5 is not allowed"),
        ("leader_tasks", ["ok.*", ""], "leader_tasks=['ok.*', ''] is not allowed"),
        ("leader_metrics_port", 70000, "leader_metrics_port=70000 is not allowed"),
        ("leader_metrics_address", 5, "leader_metrics_address=5 is not allowed"),
        ("leader_stop_grace", -1, "leader_stop_grace=-1 is not allowed"),
        ("leader_beat_metrics_port", 0.5, "leader_beat_metrics_port=0.5 is not allowed"),
        ("leader_health_stuck_after", 0, "leader_health_stuck_after=0 is not allowed"),
    ],
)
def test_values_of_the_wrong_type_are_refused(key, value, fragment):
    """Each key refuses a value of the wrong type with one line naming key and value."""
    with pytest.raises(ConfigurationError, match="^" + re.escape(fragment)):
        load_settings(conf(**{key: value}), "proj")


def test_a_misspelled_key_is_named_with_the_likely_one(caplog):
    """A typo keeps a default silently; start-up says which key was probably meant."""
    with caplog.at_level("WARNING", logger="celery_leader.settings"):
        load_settings(conf(leader_lease_tll=3, leader_lease_ttl=4), "proj")
    (record,) = caplog.records
    assert record.getMessage() == (
        "celery-leader: leader_lease_tll is not a celery-leader setting; "
        "did you mean leader_lease_ttl?"
    )


def test_a_misspelled_key_under_a_namespace_is_named_as_written(caplog):
    """Under Django's namespace the warning names CELERY_LEADER_* keys."""
    from celery import Celery

    from celery_leader.settings import settings_for_app

    app = Celery("proj")
    app.config_from_object(_DjangoStyleSettings, namespace="CELERY")
    app.conf.CELERY_LEADER_LEASE_TTL = 7
    app.conf.CELERY_LEADER_RENEW_INTERVALL = 2
    app.conf.LEADER_BOARD_PAGE_SIZE = 20  # a Django setting of the project: not ours
    with caplog.at_level("WARNING", logger="celery_leader.settings"):
        settings_for_app(app)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "celery-leader: CELERY_LEADER_RENEW_INTERVALL is not a celery-leader setting; "
        "did you mean CELERY_LEADER_RENEW_INTERVAL?"
    ]


def test_every_documented_key_is_known():
    """The settings reference the docs include and the keys the code reads are the same set."""
    from celery_leader.settings import known_names
    from celery_leader.settings.reference import render_markdown

    documented = set(re.findall(r"^### `(leader_[a-z_]+)`$", render_markdown(), flags=re.MULTILINE))
    assert documented == set(known_names())


def test_one_settings_object_per_process_with_one_entry_per_election():
    """The process reads its settings once; the workers' and beat's elections are its entries."""
    from celery import Celery

    from celery_leader.settings import app_settings, names_for_app
    from celery_leader.tasks import leader_queue_for

    app = Celery(
        "proj",
        set_as_current=False,
        config_source={
            "broker_url": "redis://127.0.0.1:6379/0",
            "leader_metrics_port": 9101,
            "leader_beat_metrics_port": 9102,
        },
    )
    settings = app_settings(app)
    assert app_settings(app) is settings
    assert set(settings.elections) == {"proj", "proj.beat"}
    assert settings.election("proj").queue == "proj.leader"
    assert settings.election("proj.beat").queue is None
    assert settings.worker.name == "proj" and settings.worker.metrics.port == 9101
    assert settings.beat_election.name == "proj.beat"
    assert settings.beat_election.metrics.port == 9102
    # Routing reads the same object, not the raw configuration again.
    assert names_for_app(app) is settings.names
    app.conf.leader_queue = "changed-after-start"
    assert leader_queue_for(app) == "proj.leader"
    with pytest.raises(KeyError):
        settings.election("billing")


def test_a_client_derives_its_queue_without_store_settings():
    """A process that only sends needs no leader_backend_url, even with a RabbitMQ broker."""
    from celery import Celery

    from celery_leader.settings import names_for_app

    app = Celery(
        "web",
        set_as_current=False,
        config_source={"broker_url": "amqp://guest:guest@127.0.0.1:5672//", "leader_name": "jobs"},
    )
    names = names_for_app(app)
    assert (names.leader, names.queue, names.beat) == ("jobs", "jobs.leader", "jobs.beat")


def test_load_settings_keeps_its_earlier_forms():
    """load_settings(conf, main, name_suffix=...) still gives one election's settings."""
    beat = load_settings(conf(leader_metrics_port=9101), "proj", name_suffix=".beat")
    assert beat.name == "proj.beat" and beat.metrics.port == 9101
    assert load_settings(conf(), "proj", name_suffix=".other").name == "proj.other"


@pytest.mark.parametrize(("value", "expected"), [(None, False), (True, True), (False, False)])
def test_leader_beat_unled_is_true_or_false(value, expected):
    """leader_beat_unled: unset is False; it is read into the process's settings."""
    from celery_leader.settings import load_app_settings

    given = {} if value is None else {"leader_beat_unled": value}
    assert load_app_settings(conf(**given), "proj").beat_unled is expected


@pytest.mark.parametrize("value", ["yes", "True", 1, 0])
def test_leader_beat_unled_refuses_anything_but_a_bool(value):
    """ "yes", "True" or 1 from an environment would be a guess: only True or False."""
    with pytest.raises(ConfigurationError) as caught:
        load_settings(conf(leader_beat_unled=value), "proj")
    assert str(caught.value) == (
        f"leader_beat_unled={value!r} is not allowed: it must be True or False"
    )


def test_leader_beat_unled_is_named_as_written_under_a_namespace():
    """Under Django's namespace its error names CELERY_LEADER_BEAT_UNLED."""
    from celery import Celery

    from celery_leader.settings import beat_unled

    app = Celery("proj", set_as_current=False)
    app.config_from_object(_DjangoStyleSettings, namespace="CELERY")
    app.conf.CELERY_LEADER_BEAT_UNLED = "no"
    with pytest.raises(ConfigurationError) as caught:
        beat_unled(app.conf)
    assert str(caught.value).startswith("CELERY_LEADER_BEAT_UNLED='no' is not allowed")


def test_a_too_short_ttl_blames_the_ttl_and_names_the_lowest_usable_one():
    """leader_lease_ttl=0.05 alone: the error names the ttl, the margin's default, and 0.2 s."""
    with pytest.raises(ConfigurationError) as caught:
        load_settings(conf(leader_lease_ttl=0.05), "proj")
    message = str(caught.value)
    assert message.startswith("leader_lease_ttl=0.05 is not allowed"), message
    assert "leader_lease_margin, which is not set and takes its default" in message
    assert message.endswith("the lowest usable ttl for a margin of 0.05 s is 0.2 s")
    assert load_settings(conf(leader_lease_ttl=0.2), "proj").timing.ttl == 0.2, "0.2 s is usable"


def test_a_margin_too_large_for_the_ttl_names_the_lowest_ttl_for_it():
    """A margin set above ttl/4 is blamed (it was set), with the lowest ttl it allows."""
    with pytest.raises(ConfigurationError) as caught:
        load_settings(conf(leader_lease_ttl=2, leader_lease_margin=1), "proj")
    message = str(caught.value)
    assert message.startswith("leader_lease_margin=1 is not allowed with leader_lease_ttl=2")
    assert message.endswith("the lowest usable ttl for a margin of 1 s is 4 s")
    assert load_settings(conf(leader_lease_ttl=4, leader_lease_margin=1), "proj").timing.ttl == 4


def test_a_too_short_ttl_is_named_as_written_under_a_namespace():
    """Under Django's namespace the ttl is CELERY_LEADER_LEASE_TTL in that error too."""
    from celery import Celery

    app = Celery("proj", set_as_current=False)
    app.config_from_object(_DjangoStyleSettings, namespace="CELERY")
    app.conf.CELERY_LEADER_LEASE_TTL = 0.05
    with pytest.raises(ConfigurationError) as caught:
        load_settings(app.conf, "proj")
    assert str(caught.value).startswith("CELERY_LEADER_LEASE_TTL=0.05 is not allowed")
