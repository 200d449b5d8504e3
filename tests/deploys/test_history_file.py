"""History files (``weft export``, ``weft replay --file``, ``weft_django.testing.replay``): a history
with every payload kind the codec keeps round-trips and replays; a truncated or hand-edited file is an
``InvalidArgumentError`` naming what is wrong (``CommandError`` from the CLI), never a traceback."""

from __future__ import annotations

import io
import json
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import weft_django as weft
from weft_django.exceptions import InvalidArgumentError
from weft_django.history_file import load, to_json
from weft_django.testing import replay, run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = "tests.history_file.kinds"


@weft.activity(name="tests.history_file.echo")
def echo(value):
    return value


@weft.workflow(name=KINDS)
def kinds(ctx, value):
    first = yield ctx.run(echo, value)
    token = str(ctx.uuid4())
    second = yield ctx.run(echo, {"nested": first, "token": token})
    return [first, second, ctx.now()]


def _every_kind() -> dict:
    return {
        "zoned": datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York")),
        "fixed": datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=45))),
        "day": date(9999, 12, 31),
        "clock": time(23, 59, 59, 999999, tzinfo=ZoneInfo("Europe/Paris")),
        "span": timedelta(days=-3, microseconds=7),
        "raw": bytes(range(256)),
        "money": Decimal("-1.10E+5"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "pair": (1, ("a", None)),
        "members": {3, 1, "x"},
        "frozen": frozenset({(1, 2)}),
        "big": 10**4000,
        "float": -0.0,
        "text": "naïve 日本語 \U0001f600 \u2028",
        (1, "non-str key"): [True, False, None],
        "$weft": "escaped key",
    }


def _export(workflow_id: str) -> dict:
    out = io.StringIO()
    call_command("weft", "export", workflow_id, stdout=out)
    return json.loads(out.getvalue())


def test_a_history_with_every_payload_kind_round_trips_and_replays(tmp_path):
    value = _every_kind()
    handle = weft.start(KINDS, args=[value], id="hf-日本語/ü 🙂")
    run_until_idle()
    first, second, _ = handle.result(timeout=10)
    assert first == value and second["nested"] == value
    path = tmp_path / "kinds.json"
    call_command("weft", "export", handle.id, "--output", str(path), stdout=io.StringIO())
    exported = _export(handle.id)
    assert json.loads(path.read_bytes().decode("utf-8")) == exported
    loaded = load(path)
    assert loaded.workflow_id == handle.id
    assert to_json(loaded) == exported  # load is export's inverse
    assert replay(path, KINDS).ok  # the completed run's code returns the recorded result again
    out = io.StringIO()
    call_command("weft", "replay", "--file", str(path), stdout=out)
    assert "0 would fail" in out.getvalue()


def _history() -> dict:
    return {
        "format": "weft-history/1",
        "workflow_id": "hand-edited",
        "run_id": str(uuid.uuid4()),
        "workflow_type": KINDS,
        "version": "1",
        "status": "running",
        "input": '{"args":[1],"kwargs":{}}',
        "result": None,
        "error": None,
        "started_at": "2026-01-01T00:00:00+00:00",
        "created_at": "2026-01-01T00:00:00+00:00",
        "steps": [
            {
                "seq": 0,
                "kind": "activity",
                "name": "tests.history_file.echo",
                "status": "completed",
                "result": "1",
                "error": None,
                "attempts": 1,
                "started_at": "2026-01-01T00:00:01+00:00",
                "completed_at": "2026-01-01T00:00:02+00:00",
            }
        ],
        "applied": [],
        "timer_seqs": [],
        "timer_kinds": {},
    }


def _step(**fields) -> dict:
    return {"steps": [{**_history()["steps"][0], **fields}]}


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"timer_kinds": [1]}, "timer_kinds"),
        ({"timer_kinds": {"x": "sleep"}}, "timer_kinds"),
        ({"timer_seqs": [1.5]}, r"timer_seqs\[0\]"),
        ({"timer_seqs": "1"}, "timer_seqs"),
        ({"input": None}, "input"),
        ({"input": {"args": [1], "kwargs": {}}}, "input"),
        ({"workflow_id": None}, "workflow_id"),
        ({"status": "complete"}, "status"),
        ({"started_at": "2026-01-01T00:00:00"}, "started_at"),
        ({"started_at": 5}, "started_at"),
        ({"steps": {"0": {}}}, "steps"),
        ({"steps": ["x"]}, r"steps\[0\]"),
        (_step(seq=1.5), r"steps\[0\]\.seq"),
        (_step(seq=-1), r"steps\[0\]\.seq"),
        (_step(seq=True), r"steps\[0\]\.seq"),
        (_step(result=5), r"steps\[0\]\.result"),
        (_step(status="done"), r"steps\[0\]\.status"),
        (_step(completed_at="2026-01-01 00:00:02"), r"steps\[0\]\.completed_at"),
        ({"steps": _history()["steps"] * 2}, "appears twice"),
        ({"applied": [{"seq": 0, "n": 0, "name": "u", "payload": None}]}, r"applied\[0\]\.payload"),
        ({"applied": [{"seq": 0, "name": "u", "payload": "1"}]}, r"applied\[0\]\.n is missing"),
    ],
)
def test_a_hand_edited_history_is_refused_naming_the_field(edit, words):
    with pytest.raises(InvalidArgumentError, match=words):
        replay({**_history(), **edit}, KINDS)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('"seq": Infinity', "Infinity"),
        ('"seq": NaN', "NaN"),
        ('"seq": 1e400', "seq"),
    ],
)
def test_non_numbers_in_the_json_text_are_refused(text, words):
    body = json.dumps(_history()).replace('"seq": 0', text)
    with pytest.raises(InvalidArgumentError, match=words):
        load(body)


def test_json_nested_too_deep_is_not_a_recursion_error():
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        load('{"format": "weft-history/1", "input": ' + "[" * 100_000 + "]" * 100_000 + "}")


def test_a_truncated_or_unreadable_file_is_an_invalid_argument(tmp_path):
    text = json.dumps({**_history(), "workflow_id": "日本語"}, ensure_ascii=False).encode("utf-8")
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: text.index("日".encode()) + 1])  # cut inside a character
    latin = tmp_path / "latin.json"
    latin.write_bytes(json.dumps({**_history(), "workflow_id": "café"}, ensure_ascii=False).encode("latin-1"))
    short = tmp_path / "short.json"
    short.write_bytes(text[: len(text) // 2])
    for path in (cut, str(cut), latin, short, "a\x00b.json"):
        with pytest.raises(InvalidArgumentError, match="history"):
            load(path)
    with pytest.raises(CommandError, match="history file"):
        call_command("weft", "replay", "--file", str(cut), stdout=io.StringIO())


@pytest.mark.parametrize(
    "args",
    [
        ["export", "a\x00b"],
        ["export", "a\ud800b"],
        ["replay", "--type", "a\x00b"],
        ["replay", "--type", "a\ud800b"],
        ["weft_replay", "--type", "a\x00b"],
    ],
)
def test_export_and_replay_refuse_text_the_database_cannot_take(args):
    """An id or a type with a NUL (PostgreSQL: DataError) or a lone surrogate (UnicodeEncodeError) went
    to the database and escaped as a traceback instead of the command's error."""
    command = ["weft", *args] if args[0] != "weft_replay" else args
    with pytest.raises(CommandError, match=r"NUL|surrogate|control characters"):
        call_command(*command, stdout=io.StringIO(), stderr=io.StringIO())
