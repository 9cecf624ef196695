"""What store classes declare (LeaseStoreClass), and the registry's messages built from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_leader.exceptions import ConfigurationError
from celery_leader.stores.registry import (
    BUILTIN_STORES,
    TEST_ONLY_SCHEMES,
    _load,
    shared_store_urls,
    store_class,
    validate_store_options,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scheme", sorted(BUILTIN_STORES))
def test_each_class_declares_the_schemes_it_is_registered_for(scheme):
    cls = _load(BUILTIN_STORES[scheme])
    registered = {name for name, path in BUILTIN_STORES.items() if path == BUILTIN_STORES[scheme]}
    assert {form.partition(":")[0] for form in cls.schemes} == registered
    assert all(form.endswith(("://", ":///")) for form in cls.schemes)


@pytest.mark.parametrize("scheme", sorted(BUILTIN_STORES))
def test_declared_extra_ttl_range_and_renew_fraction_are_usable(scheme):
    cls = _load(BUILTIN_STORES[scheme])
    import tomllib  # Python 3.11+: this test is not in the compat subset run on 3.10

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert cls.extra is None or cls.extra in extras
    low, high = cls.ttl_range
    assert low is None or high is None or 0 < low <= high
    assert 0 < cls.default_renew_fraction < 0.5
    assert all(key.startswith("leader_") for key in cls.option_keys)


def test_shared_store_urls_are_read_from_the_classes():
    assert shared_store_urls() == (
        "redis://, rediss://, unix://, sentinel://, postgresql://, postgres://, sqlite:///, "
        "azureblob://, etcd:// or etcds://"
    )
    assert not any(scheme + "://" in shared_store_urls() for scheme in TEST_ONLY_SCHEMES)


def test_the_workers_memory_store_message_names_the_same_stores():
    """The worker's memory:// refusal lists the stores from their metadata."""
    from celery_leader.worker.bootsteps import ERR_MEMORY_STORE

    text = ERR_MEMORY_STORE.format(urls=shared_store_urls())
    assert text.endswith("workers need a shared store: " + shared_store_urls())


def test_unknown_scheme_names_every_store_as_declared():
    with pytest.raises(ConfigurationError) as caught:
        store_class("consul://h")
    assert str(caught.value).endswith(
        "use one of azureblob://, etcd://, etcds://, postgres://, postgresql://, redis://,"
        " rediss://, sentinel://, sqlite:///, unix://"
    )


def test_a_store_checks_its_own_keys_whichever_store_is_in_use():
    """Azure's keys are checked by the Azure class, also with a Redis URL."""
    with pytest.raises(ConfigurationError, match=r"^leader_azure_watch_interval=0 is not allowed"):
        validate_store_options("redis://h", {"leader_azure_watch_interval": 0})
    with pytest.raises(ConfigurationError, match=r"^leader_azure_connection_string \(int\)"):
        store_class("azureblob://c/p").validate_options({"leader_azure_connection_string": 5})
    validate_store_options("redis://h", {})
    validate_store_options("azureblob://c/p", {"leader_azure_watch_interval": "0.5"})


def test_secrets_never_appear_in_option_errors():
    with pytest.raises(ConfigurationError) as caught:
        validate_store_options("redis://h", {"leader_azure_account_url": "ftp://user:topsecret@h"})
    assert "topsecret" not in str(caught.value)


class UndeclaredStore:
    """A store class from an entry point that declares none of the metadata."""


def test_a_store_class_without_its_metadata_is_named_with_what_it_lacks():
    from celery_leader.stores.registry import _load

    with pytest.raises(ImportError, match="does not declare schemes, extra"):
        _load(f"{__name__}:UndeclaredStore")
