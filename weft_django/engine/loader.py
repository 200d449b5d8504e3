"""The loader: reads freshly claimed workflows (store/histories.py: one round trip per chunk of ids
on PostgreSQL) and starts driving their runs through the state machine. A row it cannot convert
leaves only its own workflow out (engine/containment.py); a run whose code this engine lacks, or
whose start raises, gets stuck; a run that ended meanwhile has its claim released."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime

from django.db import DatabaseError

from ..exceptions import VersionMismatchError, WeftError, WorkflowNotRegisteredError
from ..models import Timer
from ..registry import registry
from ..status import WorkflowStatus
from ..store.commit import WorkflowWrites
from ..store.histories import AdmittedRow, Loaded, RunRow, load, merge_loaded
from . import ownership
from .containment import internal_error, load_each
from .driver import AppliedRecord, StepRecord
from .owned import Owned, mark_stuck
from .progress import Progress

logger = logging.getLogger("weft_django.engine.engine")


class Loader:
    """Loads claimed workflows and hands their runs to the state machine.

    Args:
        engine_id: this engine.
        using: the connection alias.
        progress: the state machine that drives the loaded runs.
        drop: the loop's way to stop driving a workflow (workflow id, reason or None).
        on_started: called for each run started, with the admitted updates read with it (only when
            the load read them: PostgreSQL's batch).
    """

    def __init__(
        self,
        engine_id: str,
        using: str,
        progress: Progress,
        drop: Callable[[str, str | None], None],
        on_started: Callable[[Owned, list[AdmittedRow]], None],
    ) -> None:
        self.engine_id = engine_id
        self.using = using
        self.progress = progress
        self.drop = drop
        self.on_started = on_started

    def load(
        self,
        claimed: dict[str, int],
        now: datetime,
        writes: dict[str, WorkflowWrites],
        changed: set[str],
        preloaded: Loaded | None = None,
        preloaded_for: Collection[str] = (),
    ) -> None:
        """Start driving these claimed workflows (id: epoch); release the claims of those whose run
        is not running any more. The started ones are added to ``changed``.

        Args:
            preloaded: what was already read for some of them (the claim statement's own load).
            preloaded_for: the workflows ``preloaded`` was read for: they are not read again.

        Raises:
            DatabaseError: the database failed (the loop reloads).
        """
        unreadable: set[str] = set()  # made stuck in ``writes``: that commit releases their claims
        try:
            if preloaded is None:
                loaded = load(list(claimed), self.using)
            else:
                rest = [wid for wid in claimed if wid not in preloaded_for]
                loaded = merge_loaded(preloaded, load(rest, self.using)) if rest else preloaded
        except DatabaseError:
            raise
        except Exception as exc:  # a row the loader cannot convert: only its workflow is left out
            loaded, unreadable = load_each(self.engine_id, self.using, claimed, now, writes, exc)
        release: dict[str, int] = {}
        for wid, epoch in claimed.items():
            row = loaded.runs.get(wid)
            if row is None or row.status != WorkflowStatus.RUNNING:
                if wid not in unreadable:
                    release[wid] = epoch
                continue
            run_id = str(row.run_id)
            history, timers, applied = loaded.steps[run_id], loaded.timers.get(wid, []), loaded.applied.get(run_id)
            try:
                owned = self._start_run(row, epoch, history, timers, applied, now, writes)
            except Exception as exc:  # a bug handling this one workflow: it gets stuck, the batch goes on
                logger.exception("starting workflow=%s failed engine=%s", wid, self.engine_id)
                self.drop(wid, None)
                writes.pop(wid, None)
                error = internal_error(wid, exc)
                mark_stuck(self.engine_id, wid, run_id, epoch, row.stuck_attempts, error, now, writes)
                continue
            if owned is not None:
                changed.add(wid)
                if loaded.admitted is not None:
                    self.on_started(owned, loaded.admitted.get(wid, []))
                mailbox = loaded.signals.get(wid) if loaded.signals is not None else None
                if mailbox is not None:  # its mailbox as the load saw it (engine/signal_delivery.py)
                    owned.signal_top = mailbox.top
                    owned.signals_known = {row[0]: row for row in mailbox.rows if str(row[2]) == owned.run_id}
        if release:
            ownership.release(self.engine_id, release, self.using)

    def _start_run(
        self,
        row: RunRow,
        epoch: int,
        history: dict[int, StepRecord],
        timers: list[Timer],
        applied: list[AppliedRecord] | None,
        now: datetime,
        writes: dict[str, WorkflowWrites],
    ) -> Owned | None:
        try:
            definition = registry.workflow(row.workflow_type, row.version)
        except WorkflowNotRegisteredError as exc:
            error: WeftError = exc
            if row.workflow_type in registry.latest:
                error = VersionMismatchError(
                    f"Workflow {row.id!r} runs {row.workflow_type!r} version {row.version!r}, but this engine "
                    f"has version {registry.latest[row.workflow_type].version!r}. Deploy code that registers "
                    f"version {row.version!r} (keep the old version registered next to the new one)."
                )
            mark_stuck(self.engine_id, row.id, str(row.run_id), epoch, row.stuck_attempts, error, now, writes)
            return None
        return self.progress.adopt(row, epoch, definition, history, timers, applied, writes)
