"""Count the SQL a Django process sends, per statement shape, per thread, and per transaction.

Used two ways:

* in the benchmark process itself (``install()``), to know which part of the database-wide counters
  the client caused (its starts and its polling);
* around an engine: ``python -m benchmarks.sqltrace --out FILE -- weft_engine --engine-id X ...`` runs
  the management command exactly as ``python -m django weft_engine ...`` would, and writes the
  counts to FILE when the engine exits. Only used with ``run.py --trace-sql``; the headline figures come
  from an untraced engine.

The hook is Django's ``connection.execute_wrappers`` (installed on every new connection), so it sees
every statement sent through the ORM or ``connection.cursor()``, including savepoints. It does not
see psycopg connections opened outside Django (the engine's LISTEN connection: one statement) nor
the statements Django runs while opening a connection. A "transaction" is one autocommit statement,
or one outermost ``atomic()`` block that ran at least one statement (committed or rolled back).
Per-call cost: a dict lookup and a counter increment; shapes are normalised only when reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from collections import Counter
from typing import Any

_lock = threading.Lock()
_statements: Counter[tuple[str, str]] = Counter()  # (thread group, raw sql) -> calls
_transactions: Counter[tuple[str, str]] = Counter()  # (thread group, "read"|"write") -> count
_rollbacks: Counter[str] = Counter()
_tx_state: dict[int, dict[str, Any]] = {}  # id(connection) -> {"open": bool, "write": bool}

# WEFT_BENCH_TIMELINE=FILE: also record every statement with its wall-clock start and duration
# (time.time(), comparable across processes on one machine), for benchmarks/critical_path.py.
TIMELINE = os.environ.get("WEFT_BENCH_TIMELINE")
_timeline: list[tuple[float, float, str, str]] = []  # (start, seconds, thread group, sql)


def mark(label: str) -> None:
    """Record a point on the timeline (a client's "start", "result returned")."""
    if TIMELINE:
        _timeline.append((time.time(), 0.0, _group(), label))


def dump_timeline(path: str | None = None) -> None:
    """Write the recorded timeline (JSON list of [start, seconds, thread, sql]) to ``path``."""
    with open(path or TIMELINE or "timeline.json", "w") as handle:
        json.dump([[t, d, g, normalise(s)[:160]] for t, d, g, s in _timeline], handle)


_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b|\bFOR (NO KEY )?UPDATE\b|\bnextval\(|\bpg_notify\(", re.I)


def _group() -> str:
    name = threading.current_thread().name
    for prefix in ("weft-activity", "weft-renew", "weft-listen"):
        if name.startswith(prefix):
            return prefix
    return "main" if name == "MainThread" else name


def _wrapper(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    connection = context["connection"]
    group = _group()
    writes = bool(_WRITE.search(sql))
    with _lock:
        _statements[(group, sql)] += 1
        if not connection.in_atomic_block:
            _transactions[(group, "write" if writes else "read")] += 1
        else:
            state = _tx_state.setdefault(id(connection), {"open": False, "write": False, "group": group})
            state["open"] = True
            state["write"] |= writes
            state["group"] = group
    if not TIMELINE:
        return execute(sql, params, many, context)
    began, clock = time.time(), time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        _timeline.append((began, time.perf_counter() - clock, group, sql))


def _end_transaction(connection: Any, rolled_back: bool) -> None:
    with _lock:
        state = _tx_state.get(id(connection))
        if state and state["open"]:
            _transactions[(state["group"], "write" if state["write"] else "read")] += 1
            if rolled_back:
                _rollbacks[state["group"]] += 1
        _tx_state[id(connection)] = {"open": False, "write": False, "group": _group()}


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(_wrapper)
    if not getattr(connection, "_bench_trace_patched", False):
        connection._bench_trace_patched = True
        commit, rollback = connection.commit, connection.rollback

        def traced_commit() -> None:
            try:
                commit()
            finally:
                _end_transaction(connection, rolled_back=False)

        def traced_rollback() -> None:
            try:
                rollback()
            finally:
                _end_transaction(connection, rolled_back=True)

        connection.commit = traced_commit
        connection.rollback = traced_rollback


def install() -> None:
    """Trace every Django connection this process opens from now on (and the already open ones)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection_created, dispatch_uid="weft-bench-sqltrace")
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            _on_connection_created(None, connection)


def reset() -> None:
    with _lock:
        _statements.clear()
        _transactions.clear()
        _rollbacks.clear()


_IN_LIST = re.compile(r"\((\s*%s\s*,)+\s*%s\s*\)")
_VALUES_LIST = re.compile(r"VALUES\s*(\([^()]*\)\s*,\s*)+\([^()]*\)", re.I)
_SPACES = re.compile(r"\s+")


def normalise(sql: str) -> str:
    """One shape per statement: IN lists and multi-row VALUES collapsed, whitespace squeezed."""
    sql = _SPACES.sub(" ", sql).strip()
    sql = _IN_LIST.sub("(%s, ...)", sql)
    return _VALUES_LIST.sub("VALUES (...), ...", sql)


def snapshot() -> dict[str, Any]:
    """The counts so far: totals per thread group, transactions read/write, statements by shape."""
    with _lock:
        statements = Counter(_statements)
        transactions = Counter(_transactions)
        rollbacks = Counter(_rollbacks)
    shapes: Counter[tuple[str, str]] = Counter()
    for (group, sql), calls in statements.items():
        shapes[(group, normalise(sql))] += calls
    groups = sorted({g for g, _ in statements} | {g for g, _ in transactions})
    return {
        "statements": sum(statements.values()),
        "transactions": sum(transactions.values()),
        "write_transactions": sum(n for (_, kind), n in transactions.items() if kind == "write"),
        "rollbacks": sum(rollbacks.values()),
        "by_thread": {
            g: {
                "statements": sum(n for (gg, _), n in statements.items() if gg == g),
                "transactions": sum(n for (gg, _), n in transactions.items() if gg == g),
                "write_transactions": transactions.get((g, "write"), 0),
            }
            for g in groups
        },
        "shapes": [{"thread": g, "calls": n, "sql": s} for (g, s), n in shapes.most_common()],
    }


def _main() -> None:
    parser = argparse.ArgumentParser(description="Run a management command with SQL tracing.")
    parser.add_argument("--out", required=True, help="Where to write the counts (JSON) when the command exits.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- <management command> <args>")
    options = parser.parse_args()
    command = [a for a in options.command if a != "--"] if options.command[:1] == ["--"] else options.command
    import django

    django.setup()
    install()
    from django.core.management import call_command

    try:
        call_command(*command)
    finally:
        with open(options.out, "w") as handle:
            json.dump(snapshot(), handle, indent=1)
        if TIMELINE:
            dump_timeline()


if __name__ == "__main__":
    _main()
