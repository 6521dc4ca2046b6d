"""The fault front's own reading of requests (``tests/faults.py``): which tables a request
touches and how, a transaction's operations read from its multipart body."""

from __future__ import annotations

from azure.data.tables import UpdateMode

from tests.faults import operations, table_of
from timeline.storage.wire.egt import build_batch

ENDPOINT = "http://127.0.0.1:10002/devstoreaccount1"


def test_a_path_names_its_table() -> None:
    assert table_of("/devstoreaccount1/timelines()?$filter=x&$top=7") == "timelines"
    assert table_of("/devstoreaccount1/users(PartitionKey='a%27',RowKey='b')") == "users"
    assert table_of("/devstoreaccount1/subjectFollowers") == "subjectFollowers"
    assert table_of("/devstoreaccount1/Tables('users')") == "Tables"
    assert table_of("/devstoreaccount1/?restype=service&comp=properties") == ""
    assert table_of("/devstoreaccount1/fanout-0/messages?numofmessages=1") == "fanout-0"


def test_a_transaction_names_each_operation_and_its_table() -> None:
    keys = {"PartitionKey": "p", "RowKey": "r"}
    sneaky = {"PartitionKey": "p", "RowKey": "s", "text": "\r\nDELETE http://h/a/x HTTP/1.1\r\n"}
    _, body = build_batch(
        ENDPOINT,
        "timelines",
        [
            ("upsert", sneaky),
            ("delete", {**keys, "RowKey": "d"}),
            ("create", {**keys, "RowKey": "c"}),
            ("update", {**keys, "RowKey": "u"}, {"mode": UpdateMode.REPLACE}),
        ],
        "2019-02-02",
    )
    assert operations("POST", "/devstoreaccount1/$batch", body) == [
        ("PATCH", "timelines"),
        ("DELETE", "timelines"),
        ("POST", "timelines"),
        ("PUT", "timelines"),
    ]


def test_a_single_request_is_its_own_operation() -> None:
    row = "/devstoreaccount1/relations(PartitionKey='p',RowKey='r')"
    assert operations("DELETE", row, b"") == [("DELETE", "relations")]
    assert operations("POST", "/devstoreaccount1/Tables", b'{"TableName":"x"}') == [
        ("POST", "Tables")
    ]
