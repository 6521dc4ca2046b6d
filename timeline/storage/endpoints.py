"""How one storage account is reached: a connection string (account key or SAS), or endpoint
URLs signed in with a Microsoft Entra ID token (``azure-identity``).

An account travels as one whitespace-free line (``Settings.connection_string`` joins them),
so every program and the connection file carry accounts the same way:

- a connection string with ``AccountKey`` or ``SharedAccessSignature``: shared key or SAS;
- a connection string with endpoints and no secret (``TableEndpoint=...;QueueEndpoint=...``):
  Entra ID, through the process's token credential (``DefaultAzureCredential``);
- either of these, then ``|`` and a second one: the queues live in that other account.
"""

from __future__ import annotations

from dataclasses import dataclass

from azure.core.credentials import AzureNamedKeyCredential
from azure.data.tables import TableServiceClient as SyncTableServiceClient

from timeline.errors import ConfigurationError

COSMOS_HOSTS = (".cosmos.azure.com", ".cosmosdb.azure.com", ".documents.azure.com")
"""Host suffixes of Azure Cosmos DB (its Table API and its other APIs)."""
COSMOS_REFUSED = (
    "Azure Cosmos DB's Table API is not supported: it does not return a partition's rows "
    "in RowKey order, which newest-first timeline pages rely on; use an Azure Storage account"
)
_SECRETS = ("accountkey", "sharedaccesssignature")
_PLACEHOLDER = AzureNamedKeyCredential("placeholder", "cGxhY2Vob2xkZXI=")
"""Lets the SDK normalise a token account's URL exactly as it does a keyed one's."""


def refuse_cosmos(text: str) -> None:
    """Raise ``ConfigurationError`` when ``text`` names a Cosmos DB endpoint (by its host: a
    storage account may well be named ``cosmos...``)."""
    lowered = text.lower()
    if any(host in lowered for host in COSMOS_HOSTS):
        raise ConfigurationError(COSMOS_REFUSED)


@dataclass(frozen=True, slots=True)
class Side:
    """One service (tables or queues) of an account: its connection string when it signs
    in with a key or SAS, else its URL and an Entra ID token."""

    connection_string: str | None
    url: str

    @property
    def uses_token(self) -> bool:
        return self.connection_string is None


@dataclass(frozen=True, slots=True)
class Account:
    """One configured account: where its tables are, and where its queues are."""

    line: str
    table: Side
    queue: Side

    @property
    def uses_token(self) -> bool:
        return self.table.uses_token or self.queue.uses_token

    @property
    def id(self) -> str:
        """What names it in the stored placement: its table endpoint (never a secret), the
        same whether it signs in with a key, a SAS or a token."""
        if self.table.connection_string is not None:
            client = SyncTableServiceClient.from_connection_string(self.table.connection_string)
        else:
            client = SyncTableServiceClient(endpoint=self.table.url, credential=_PLACEHOLDER)
        with client:
            return str(client.url).rstrip("/")


def parse_account(line: str) -> Account:
    """One account line (see the module docstring); ``ConfigurationError`` when invalid."""
    refuse_cosmos(line)
    table_text, _, queue_text = line.partition("|")
    table = _side(table_text, "table")
    queue = _side(queue_text or table_text, "queue")
    return Account(line, table, queue)


def _side(text: str, service: str) -> Side:
    fields = _fields(text)
    if any(fields.get(name) for name in _SECRETS):
        return Side(text, fields.get(f"{service}endpoint", ""))
    url = fields.get(f"{service}endpoint") or _derived(fields, service)
    if not url.startswith("https://"):
        raise ConfigurationError(
            f"the {service} endpoint {url!r} signs in with Entra ID, which needs https://"
        )
    return Side(None, url.rstrip("/"))


def _fields(text: str) -> dict[str, str]:
    """A connection string's ``Name=value`` pairs, names lower-cased (values keep any '=')."""
    fields: dict[str, str] = {}
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        name, equals, value = part.partition("=")
        if not equals:
            raise ConfigurationError("a storage connection string is not valid: no '=' in a part")
        fields[name.strip().lower()] = value.strip()
    return fields


def _derived(fields: dict[str, str], service: str) -> str:
    """The ``service`` endpoint of an account named by its other endpoint or its name."""
    table = fields.get("tableendpoint", "")
    if service == "queue" and ".table." in table:
        return table.replace(".table.", ".queue.", 1)
    name = fields.get("accountname")
    if name:
        suffix = fields.get("endpointsuffix", "core.windows.net")
        return f"https://{name}.{service}.{suffix}"
    raise ConfigurationError(
        f"no {service} endpoint for a storage account: give its URL "
        f"(TIMELINE_STORAGE_{service.upper()}_URLS)"
    )


def _listed(text: str | None) -> list[str]:
    return text.split() if text else []


def account_lines(
    connection_strings: str | None,
    table_urls: str | None,
    queue_urls: str | None,
    queue_connection_strings: str | None,
) -> list[str]:
    """The configured accounts as account lines (see the module docstring): connection
    strings, or table URLs (Entra ID); queues where ``queue_*`` says (one for every account,
    or one per account in the same order), else in each account itself. Raises
    ``ConfigurationError`` on a configuration that cannot be meant."""
    strings, tables = _listed(connection_strings), _listed(table_urls)
    queue_urls_list, queue_strings = _listed(queue_urls), _listed(queue_connection_strings)
    if strings and tables:
        raise ConfigurationError(
            "set either TIMELINE_STORAGE_CONNECTION_STRINGS or TIMELINE_STORAGE_TABLE_URLS, "
            "not both"
        )
    if queue_urls_list and not tables:
        raise ConfigurationError("TIMELINE_STORAGE_QUEUE_URLS needs TIMELINE_STORAGE_TABLE_URLS")
    if queue_strings and not strings:
        raise ConfigurationError(
            "TIMELINE_STORAGE_QUEUE_CONNECTION_STRINGS needs TIMELINE_STORAGE_CONNECTION_STRINGS"
        )
    accounts = strings or tables
    queues = _per_account(queue_strings or queue_urls_list, len(accounts))
    lines: list[str] = []
    for index, account in enumerate(accounts):
        queue = queues[index] if queues else None
        if strings:
            lines.append(f"{account}|{queue}" if queue else account)
        else:
            lines.append(f"TableEndpoint={account};" + (f"QueueEndpoint={queue};" if queue else ""))
    for line in lines:
        parse_account(line)
    return lines


def _per_account(queues: list[str], accounts: int) -> list[str]:
    if not queues or len(queues) == accounts:
        return queues
    if len(queues) == 1:
        return queues * accounts
    raise ConfigurationError(
        f"{len(queues)} queue accounts for {accounts} storage accounts: give one for all, "
        "or one per account in the same order"
    )
