"""Test-only audit of every write the chaos run makes: PostgreSQL triggers record each INSERT, UPDATE
and DELETE on the workflow, step, claim, buffered-signal, pending-update and applied-update tables
into ``weft_audit.writes``; afterwards ``check_audit`` reads that log and reports every write that
should not have happened. Never part of the library's migrations: ``install`` puts the triggers into
the chaos database for one run and ``uninstall`` removes them (the suite's test database is shared
with the rest of the suite).

Who wrote: the engines of the chaos run connect with ``application_name = 'weft-<engine id>'``
(PGAPPNAME, set by the harness for every connection of the subprocess: loop, renewal, activity
threads); any other session is a client (the test process: start, signal, update, cancel).

Under which epoch: the trigger reads the workflow's claim row in the writing transaction (a fresh
snapshot: the newest committed version, or this transaction's own) and whether this transaction holds
that row (its xmin or xmax is one of this transaction's ids: the fence's ``FOR NO KEY UPDATE`` or this
transaction's own update of the claim). A fenced write is one made while the writer holds the claim
row locked and the claim names the writer; a step's ``epoch`` column must equal the claim's epoch.
When the same transaction also changed the claim (a release in the terminal commit), the checker
takes the claim as it was before that change (the OLD values of the transaction's first claim write).

What is checked (each a list of violations, empty when the run kept its promise):

- ``A1 fenced writes``: every engine write of workflow-scoped state (steps, applied updates, the end
  of a run, a signal consumed or dropped, an update settled) was made by the claim's holder, under
  the claim's current epoch, with the claim row locked by the writing transaction; the engine's own
  claim writes have a legitimate shape (acquire a free claim, take over an expired one, renew or
  release its own); writes only an engine may make did not come from a client. The legitimate
  non-fenced writers are told apart: a client's start, signal, update, its caller-side expiry and its
  transitions (cancel); an engine's child-terminal record into a parent's mailbox, its children and
  schedule fires, and its message cleanup (expiring abandoned updates, failing those of ended runs).
- ``A2 no duplicate steps``: no (run, seq) inserted twice; no settled step's outcome rewritten.
- ``A3 no run ended twice``: a run goes from active to terminal at most once, and nothing changes
  after that.
- ``A4 no double consumption or settlement``: a signal is consumed at most once, and never after it
  was dropped; an update is settled (completed, rejected, failed, expired) at most once.
- ``A5 durable in the order made``: in a sequential workflow, a step becomes durable only with or
  after the step before it settled; an applied update or an update's settlement only with or after
  every step before the one it was applied at; a signal is consumed in the same commit as its step.
- ``A6 acknowledged messages in the final history``: every update whose ``update()`` returned has its
  record in the run that finished (an applied-update row, or the wait_for_update step that took it),
  and every acknowledged signal was consumed by a settled signal step of that run, or dropped because
  the run ended.

The work is split by job: ``audit_triggers`` (the trigger SQL, ``install``, ``uninstall``), ``audit_log``
(``Write``, ``load``, the indexed ``Audit``) and ``audit_checks`` (A1-A6, ``AckedMessage``, ``check_audit``);
this module is the public face and re-exports their names.
"""

from __future__ import annotations

from tests.chaos.audit_checks import (
    ACTIVE,
    STEP_SETTLED,
    TERMINAL,
    UPDATE_SETTLED,
    AckedMessage,
    acknowledged_in_history,
    check_audit,
    double_consumption,
    duplicate_steps,
    durable_in_order,
    runs_ended_twice,
)
from tests.chaos.audit_log import Audit, Write, load
from tests.chaos.audit_triggers import AUDITED, ENGINE_PREFIX, INSTALL_SQL, SCHEMA, SHORT, install, uninstall

__all__ = [
    "ACTIVE",
    "AUDITED",
    "ENGINE_PREFIX",
    "INSTALL_SQL",
    "SCHEMA",
    "SHORT",
    "STEP_SETTLED",
    "TERMINAL",
    "UPDATE_SETTLED",
    "AckedMessage",
    "Audit",
    "Write",
    "acknowledged_in_history",
    "check_audit",
    "double_consumption",
    "duplicate_steps",
    "durable_in_order",
    "install",
    "load",
    "runs_ended_twice",
    "uninstall",
]
