"""The client: start runs, get handles, signal, describe, wait for results, and the transitions.

Clients write rows and send wake-ups; they never claim a workflow and never run one. ``start``,
``signal`` and the transitions join the caller's ``transaction.atomic()`` on the WEFT database and
take effect (wake-up included) when it commits. ``result`` waits for an engine, so it never joins
the caller's transaction: it runs on a "weft-wait" thread with its own autocommit connection.

The package, by job: ``starting`` (start, start_or_signal, start_with_update), ``bulk`` (start_many), ``handles``
(WorkflowHandle, get_handle, cancel, results), ``messages`` (signal, query, update) and ``common``
(argument checks). Every name is importable from ``weft_django.client`` as before the split.
"""

from __future__ import annotations

import logging

from .. import starter
from ..exceptions import InvalidArgumentError, InvalidWorkflowIdError
from ..store.runs import _CLAIM_COLUMNS, _build_start_statement, _start_statement  # noqa: F401 - for tests
from ..validation import (  # noqa: F401 - MAX_*: re-exported for the admin's forms
    MAX_ID_LENGTH,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    validate_key,
    validate_name,
    validate_reason,
    validate_workflow_id,
)
from ..waits import close_connections
from .bulk import MAX_START_MANY, StartRequest, astart_many, start_many  # noqa: F401
from .common import (  # noqa: F401 - the names modules and tests import from weft_django.client
    _UNSET,
    ON_CONFLICT,
    SUMMARY_FIELDS,
    _alias,
    _duration,
    _encode_input,
    _start_time,
    _status,
    _validate_key,
    _validate_name,
    _wait_seconds,
)
from .handles import WorkflowHandle, _outcome, cancel, get_handle  # noqa: F401
from .messages import _buffer_signal, _submit_query, _submit_update, aquery, aupdate, query, signal, update  # noqa: F401
from .starting import (  # noqa: F401
    _admit_starting,
    _check_type,
    _existing_for_key,
    _insert_run,
    _Plan,
    _replace_run,
    _resolve_conflict,
    _start_with_id,
    _start_with_key,
    _try_insert_run,
    _with_run,
    astart,
    start,
    start_or_signal,
    start_with_update,
)

logger = logging.getLogger("weft_django.client")
starter.install(start)  # WorkflowDefinition.start (the registry cannot import the client: it reads the registry)

__all__ = [
    "InvalidArgumentError",
    "InvalidWorkflowIdError",
    "StartRequest",
    "WorkflowHandle",
    "aquery",
    "astart",
    "astart_many",
    "aupdate",
    "cancel",
    "close_connections",
    "get_handle",
    "query",
    "signal",
    "start",
    "start_many",
    "start_or_signal",
    "start_with_update",
    "update",
]
