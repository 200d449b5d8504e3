"""Values of a workflow's rows that a hand edit may have left in a shape the engine cannot take: each is
raised as ``UnreadableRow`` naming the row and column, so only that workflow is made stuck ("its rows
cannot be read by the engine", engine/containment.py), never the engine nor another workflow, and the
operator sees what to repair.

The engine's load (store/histories.py) checks what it would otherwise take on trust: a timer of a kind
weft never writes, or with no step where one is needed (its ``seq`` NULL, or SQLite text); a step or an
applied update whose ``seq`` is not a number (SQLite keeps any text in an integer column); an id that
is no uuid (SQLite keeps any text in a uuid column).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast

from ..status import TimerKind

TIMER_KINDS = frozenset(kind.value for kind in TimerKind)
# The timers the engine arms for one step of a run (engine/progress.py): each names its step in ``seq``.
AT_A_STEP = frozenset(
    {
        TimerKind.SLEEP,
        TimerKind.SIGNAL_TIMEOUT,
        TimerKind.WAIT_CONDITION,
        TimerKind.ACTIVITY_RETRY,
        TimerKind.ACTIVITY_TIMEOUT,
    }
)


class UnreadableRow(ValueError):
    """The database returned a row its driver cannot convert to Python (on PostgreSQL a timestamp past
    year 9999 or ``'infinity'``, an interval past ``timedelta``'s range; psycopg raises ``DataError``
    for it while converting a result it already holds), or a value of a shape weft never writes (a
    hand edit). Not a failure of the database, so only that row's workflow is left out
    (engine/containment.load_each)."""


def shown(value: Any) -> str:
    """A stored value as the reasons quote it (NULL for None)."""
    return "NULL" if value is None else repr(value)


def number(value: Any, what: str) -> int:
    """``value`` when it is a whole number (an integer column as read); else UnreadableRow ``what``
    holds it (NULL, or SQLite text)."""
    if type(value) is not int:
        raise UnreadableRow(f"{what} holds {shown(value)}, not a whole number (written by hand?)")
    return value


def uuid_text(value: Any, what: str) -> str:
    """A uuid column as text (a uuid on PostgreSQL, hex text on SQLite); UnreadableRow naming ``what``
    when it is no uuid."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise UnreadableRow(f"{what} holds {shown(value)}, not a uuid (written by hand?)") from None


def check_timer(fields: dict[str, Any]) -> None:
    """A timer row as the engine's load reads it (its fields by attname): UnreadableRow for a kind weft
    never writes, a step timer with no step (``seq``), an ``attempt`` that is not a number."""
    where = f"timer {fields.get('id')!r} of workflow {fields.get('workflow_id')!r}"
    kind = fields["kind"]
    if kind not in TIMER_KINDS:
        raise UnreadableRow(f"{where}: its kind holds {shown(kind)}, which is no kind of timer weft writes")
    if kind in AT_A_STEP:
        number(fields["seq"], f"{where}: its seq ({kind} timers name their step)")
    if fields["attempt"] is not None:
        number(fields["attempt"], f"{where}: its attempt")


def admitted_of(rows: QuerySet[Any], fields: Sequence[str], workflow_id: str) -> list[Any]:
    """``rows.values_list(*fields)`` (one workflow's admitted updates); a row the ORM cannot convert
    (SQLite: text that is no uuid in ``id`` or ``run_id``) raised as UnreadableRow naming it.

    Raises:
        UnreadableRow: with ``workflow_id`` in this frame, for engine/containment.culprit.
    """
    try:
        return list(rows.values_list(*fields))
    except (ValueError, TypeError) as exc:
        for pk, run_id in rows.values_list(Cast("id", TextField()), Cast("run_id", TextField())):
            uuid_text(pk, f"an admitted update of workflow {workflow_id!r}: its id")
            uuid_text(run_id, f"admitted update {pk!r} of workflow {workflow_id!r}: its run_id")
        raise UnreadableRow(f"an admitted update of workflow {workflow_id!r} cannot be read ({exc})") from exc


__all__ = ["AT_A_STEP", "TIMER_KINDS", "UnreadableRow", "admitted_of", "check_timer", "number", "shown", "uuid_text"]
