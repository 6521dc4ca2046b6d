"""How accounts are configured: connection strings (key or SAS), Entra ID URLs, queues in
another account, and Cosmos DB refused before anything starts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from timeline.config import Settings
from timeline.errors import ConfigurationError
from timeline.storage.accounts import Storage
from timeline.storage.endpoints import COSMOS_REFUSED, parse_account, refuse_cosmos

KEY = "cGxhY2Vob2xkZXI="
SUFFIX = "EndpointSuffix=core.windows.net"
KEYED = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};{SUFFIX}"
SAS = (
    "TableEndpoint=https://acct.table.core.windows.net/;"
    "QueueEndpoint=https://acct.queue.core.windows.net/;"
    "SharedAccessSignature=sv=2022-11-02&ss=qt&sig=abc%3D"
)
OTHER = f"DefaultEndpointsProtocol=https;AccountName=queues;AccountKey={KEY};{SUFFIX}"
THREE = " ".join(f"https://{name}.table.core.windows.net" for name in "abc")


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)


@pytest.mark.parametrize(
    "text",
    [
        f"DefaultEndpointsProtocol=https;AccountName=c;AccountKey={KEY};"
        "TableEndpoint=https://c.table.cosmos.azure.com:443/;",
        "TableEndpoint=https://c.table.cosmosdb.azure.com/;",
        f"AccountEndpoint=https://c.documents.azure.com:443/;AccountKey={KEY};",
        "TableEndpoint=https://C.TABLE.COSMOS.AZURE.COM;",
    ],
)
def test_cosmos_endpoints_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="RowKey order"):
        refuse_cosmos(text)
    with pytest.raises(ValidationError, match="Cosmos DB's Table API is not supported"):
        settings(storage_connection_string=text)


@pytest.mark.parametrize(
    "text",
    [
        f"DefaultEndpointsProtocol=https;AccountName=cosmosarchive;AccountKey={KEY};"
        "TableEndpoint=https://cosmosarchive.table.core.windows.net/;",
        "TableEndpoint=https://mycosmos.table.core.windows.net;",
    ],
)
def test_a_storage_account_named_cosmos_is_accepted(text: str) -> None:
    refuse_cosmos(text)
    assert settings(storage_connection_string=text).account_lines() == [text]


def test_cosmos_is_refused_as_a_table_url_too() -> None:
    with pytest.raises(ValidationError) as raised:
        settings(storage_table_urls="https://c.table.cosmos.azure.com")
    assert COSMOS_REFUSED in str(raised.value)


@pytest.mark.parametrize("text", [KEYED, SAS, "TableEndpoint=https://acct.table.core.windows.net"])
def test_storage_accounts_are_accepted(text: str) -> None:
    settings(storage_connection_string=text)
    refuse_cosmos(text)


def test_key_sas_and_token_name_the_same_account_alike() -> None:
    """Moving an account from its key to Entra ID keeps its id in the stored placement."""
    token = settings(storage_table_urls="https://acct.table.core.windows.net/")
    ids = {parse_account(line).id for line in [KEYED, SAS, *token.account_lines()]}
    assert ids == {"https://acct.table.core.windows.net"}


def test_table_urls_sign_in_with_a_token_and_derive_queues() -> None:
    lines = settings(
        storage_table_urls="https://a.table.core.windows.net https://b.table.core.windows.net"
    ).account_lines()
    accounts = [parse_account(line) for line in lines]
    assert all(account.table.uses_token and account.queue.uses_token for account in accounts)
    assert [account.queue.url for account in accounts] == [
        "https://a.queue.core.windows.net",
        "https://b.queue.core.windows.net",
    ]
    assert len(Storage(lines).account_ids) == 2


def test_one_queue_account_serves_every_account() -> None:
    lines = settings(
        storage_table_urls="https://a.table.core.windows.net https://b.table.core.windows.net",
        storage_queue_urls="https://q.queue.core.windows.net/",
    ).account_lines()
    assert {parse_account(line).queue.url for line in lines} == {"https://q.queue.core.windows.net"}


def test_queues_in_another_keyed_account() -> None:
    (line,) = settings(
        storage_connection_strings=KEYED, storage_queue_connection_strings=OTHER
    ).account_lines()
    account = parse_account(line)
    assert account.table.connection_string == KEYED
    assert account.queue.connection_string == OTHER
    assert not account.uses_token


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            {
                "storage_connection_string": KEYED,
                "storage_table_urls": "https://a.table.core.windows.net",
            },
            "not both",
        ),
        (
            {"storage_queue_urls": "https://q.queue.core.windows.net"},
            "needs TIMELINE_STORAGE_TABLE",
        ),
        ({"storage_connection_string": KEYED, "storage_queue_urls": "https://q"}, "needs"),
        ({"storage_table_urls": "http://a.table.core.windows.net"}, "needs https://"),
        ({"storage_table_urls": "https://127.0.0.1:10002/devstoreaccount1"}, "no queue endpoint"),
        (
            {
                "storage_table_urls": THREE,
                "storage_queue_urls": "https://q.queue.core.windows.net https://r.queue.core.net",
            },
            "2 queue accounts for 3 storage accounts",
        ),
        ({"storage_connection_string": "AccountName"}, "not valid"),
    ],
)
def test_settings_that_cannot_work_are_refused(values: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        settings(**values)


def test_no_storage_means_the_embedded_one() -> None:
    assert settings().uses_embedded_azurite
    assert not settings(storage_table_urls="https://a.table.core.windows.net").uses_embedded_azurite
