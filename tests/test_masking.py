"""Secrets are masked in URLs and free text."""

from __future__ import annotations

import pytest

from celery_leader._masking import mask_text, mask_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:pw@h:6380/1", "rediss://user:***@h:6380/1"),
        ("redis://pwonly@h/0", "redis://***@h/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("unix:///tmp/r.sock?db=2&password=pw", "unix:///tmp/r.sock?db=2&password=***"),
        ("azureblob://c/b?sig=abc&sv=2020", "azureblob://c/b?sig=***&sv=2020"),
        ("sqlite:///var/x.db", "sqlite:///var/x.db"),
    ],
)
def test_mask_url(url, expected):
    """Passwords and secret query values become ***; the rest stays readable."""
    assert mask_url(url) == expected


def test_mask_text_finds_urls_and_connection_strings():
    """URLs and Azure connection-string secrets inside messages are masked."""
    text = (
        "could not reach redis://u:pw1@h:1/0; "
        "DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=abc+/==;BlobEndpoint=x"
    )
    masked = mask_text(text)
    assert "pw1" not in masked and "abc+/==" not in masked
    assert "AccountName=dev" in masked and "redis://u:***@h:1/0" in masked
