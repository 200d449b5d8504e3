"""python manage.py weft_engine: run one engine. Thin: parse, validate, run."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor

from ...exceptions import ConfigurationError, EngineLeaseAcquisitionTimeoutError, OwnershipModeMismatchError
from ...status import OwnershipMode
from ...store.backend import backend
from ..cli_format import unreachable_database

VERBOSITY_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
status_logger = logging.getLogger("weft_django.engine.status")


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1 (got {value!r})")
    return number


PROCESSES_PER_CORE = 4  # --processes' bound: one engine's loop uses about one core; more only queue for them


def max_processes() -> int:
    """The most engine processes ``--processes`` starts on this machine: PROCESSES_PER_CORE per core."""
    return (os.cpu_count() or 1) * PROCESSES_PER_CORE


def _process_count(value: str) -> int:
    """--processes: 1 to ``max_processes()``, refused before anything is read, written or forked."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    limit = max_processes()
    if not 1 <= number <= limit:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {limit}, {PROCESSES_PER_CORE} per CPU core of this machine "
            f"(got {value!r}); for more engines, run weft_engine on more machines"
        )
    return number


def _seconds_arg(value: str, *, zero: bool, infinite: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    too_long = number > threading.TIMEOUT_MAX and not infinite  # a deadline, not a wait: any length
    if math.isnan(number) or number < 0 or (number == 0 and not zero) or too_long:
        bounds = ("0 or more" if zero else "more than 0") + ("" if infinite else f", at most {threading.TIMEOUT_MAX:g}")
        raise argparse.ArgumentTypeError(f"must be a number of seconds, {bounds} (got {value!r})")
    return number


def _non_negative_float(value: str) -> float:
    """--drain-timeout: seconds, 0 or more ("inf": wait for every running activity)."""
    return _seconds_arg(value, zero=True, infinite=True)


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535 (got {value!r})")
    return number


def _positive_float(value: str) -> float:
    """--status-interval: seconds, more than 0 and at most what a thread can wait."""
    return _seconds_arg(value, zero=False, infinite=False)


def _queue_list(value: str | None) -> list[str] | None:
    """--queues "emails,reports" as a list (None: every queue)."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise CommandError("--queues needs at least one queue name, e.g. --queues emails,reports.")
    return names


class Command(BaseCommand):
    help = "Run a weft engine: claims runnable workflows and drives them to completion."
    requires_system_checks: list[str] = []  # we validate WEFT ourselves and exit before writing anything
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--engine-id", help="This engine's id (owner_engine on its claims). Default: host:pid:random."
        )
        parser.add_argument(
            "--concurrency", type=_positive_int, help="Activity threads (default ACTIVITY_CONCURRENCY)."
        )
        parser.add_argument("--once", action="store_true", help="Process what is runnable now, then exit.")
        parser.add_argument(
            "--processes",
            type=_process_count,
            default=1,
            help="Run this many engine processes (default 1): one Python loop uses about one core; each "
            "process is an engine of its own (ids <engine-id>-1, -2, ...; metrics ports PORT, PORT+1, ...) "
            "supervised by this one; at most 4 per CPU core (docs/operations.md).",
        )
        parser.add_argument(
            "--queues",
            help='Admit only from these queues of WEFT["QUEUES"], comma separated (default: every queue). '
            "Runs started without a queue are served by every engine.",
        )
        parser.add_argument(
            "--reset-ownership-mode",
            action="store_true",
            help="Forget the ownership mode recorded by earlier engines (stop every engine first), then exit. "
            "Refused while an engine still heartbeats, unless --force.",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="With --reset-ownership-mode: reset even though engines look alive (only if you know they are not).",
        )
        parser.add_argument(
            "--drain-timeout",
            type=_non_negative_float,
            default=10.0,
            help="Seconds running activities may finish after the first SIGTERM/SIGINT (default 10).",
        )
        parser.add_argument(
            "--metrics-port",
            type=_port,
            help="Serve Prometheus metrics on http://ADDR:PORT/metrics (needs prometheus-client; 0 picks a "
            "free port, printed in the banner).",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            help="Address the metrics server binds (default 127.0.0.1; 0.0.0.0 for all).",
        )
        parser.add_argument(
            "--status-interval",
            type=_positive_float,
            default=30.0,
            help="Seconds between the one-line status reports logged at -v 2 and above (default 30).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        refuse_conflicting_options(options)
        from ...conf import describe_problems, get_settings, problems

        try:
            settings = get_settings()
        except ConfigurationError as exc:
            raise CommandError(describe_problems(problems()) or str(exc)) from None
        from ...checks import sqlite_problems

        errors = [p for p in sqlite_problems(settings.database) if p.id.startswith("weft.E")]
        if errors:
            raise CommandError("\n".join(f"{p.id}: {p.message} HINT: {p.hint}" for p in errors))
        try:
            self._refuse_unapplied_migrations(settings.database)  # the command's first query
            if options["reset_ownership_mode"]:
                self._reset_ownership_mode(settings, force=options["force"])
                return
        except OperationalError as exc:
            unreachable = unreachable_database(settings.database)
            if unreachable is None:  # the database answers: another error, shown whole
                raise
            raise unreachable from exc

        child = None
        if options["processes"] > 1:
            if options["once"]:
                raise CommandError("--once runs one engine until nothing is runnable: drop --processes.")
            if settings.ownership != OwnershipMode.WORKFLOW_LEASE:  # one holds the lease / takes every claim
                raise CommandError(
                    f"--processes runs several engines, and OWNERSHIP={str(settings.ownership)!r} runs one engine at "
                    "a time: drop --processes, or use OWNERSHIP='workflow-lease' (docs/operations.md)."
                )
            from ..engine_processes import Supervisor, connection_shortfall

            shortfall = connection_shortfall(options["processes"], settings.database)
            if shortfall is not None:
                raise CommandError(shortfall)
            child = Supervisor(options["processes"], options["engine_id"], options["metrics_port"]).run()
            options = {**options, "engine_id": child.engine_id, "metrics_port": child.metrics_port}
        from ...engine.engine import Engine

        try:
            engine = Engine(
                options["engine_id"],
                concurrency=options["concurrency"],
                settings=settings,
                drain_timeout=options["drain_timeout"],
                queues=_queue_list(options["queues"]),
            )
        except ConfigurationError as exc:  # e.g. ACTIVITY_EXECUTOR="celery" without Celery installed
            raise CommandError(str(exc)) from None
        metrics_url = self._start_metrics(engine, options["metrics_port"], options["metrics_addr"])
        if options["verbosity"] >= 1:
            self.stdout.write(banner(engine, metrics_url))
            self.stdout.flush()
        if child is None:
            self._install_signal_handlers(engine)
        else:  # the supervisor tells this process when to drain or exit; its own signals only drain
            on_signals(lambda signum: engine.request_stop())
            child.watch(engine.request_stop)
        reporter = StatusReporter(engine, options["status_interval"]) if options["verbosity"] >= 2 else None
        if reporter is not None:
            reporter.start()
        if not options["once"]:
            freeze_startup_objects(engine.engine_id)
            set_switch_interval(engine.engine_id, engine.settings.engine_switch_interval)
        try:
            engine.run(once=options["once"])
        except (OwnershipModeMismatchError, EngineLeaseAcquisitionTimeoutError) as exc:
            raise CommandError(str(exc)) from None
        finally:
            if reporter is not None:
                reporter.stop()
        if engine.executor.running:
            # Activities still running after the drain are abandoned (their late results are fenced
            # out); Python would otherwise wait for their threads at exit.
            logging.getLogger("weft_django").warning(
                "exiting with abandoned activity attempts engine=%s attempts=%d",
                engine.engine_id,
                len(engine.executor.running),
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def _reset_ownership_mode(self, settings: Any, *, force: bool) -> None:
        from ..mode_reset import reset_ownership_mode

        # Two modes owning work at once breaks the ownership rules: refuse while engines still run (the
        # look and the delete under the marker's lock, which a starting engine's mode check waits for; a
        # lock held elsewhere is waited for a bounded time, then named: management/mode_reset.py).
        reset_ownership_mode(settings.database, within=settings.workflow_claim_ttl, force=force, say=self.stderr.write)
        self.stdout.write("Ownership mode marker cleared; the next engine to start records its mode.")

    def _start_metrics(self, engine: Any, port: int | None, addr: str) -> str | None:
        """Start prometheus_client's HTTP server on a daemon thread; None when not asked for."""
        if port is None:
            return None
        from ... import metrics

        if not metrics.AVAILABLE:
            raise CommandError(f"--metrics-port: {metrics.INSTALL_HINT}")
        metrics.track_engine(engine)
        try:
            bound = metrics.serve(port, addr)
        except OSError as exc:
            raise CommandError(
                f"--metrics-port {port}: cannot listen on {addr}:{port} ({exc}). Pick a free port, or 0 for any."
            ) from None
        return f"http://{addr}:{bound}/metrics"

    def _refuse_unapplied_migrations(self, alias: str) -> None:
        connection = connections[alias or DEFAULT_DB_ALIAS]
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            pending = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
            raise CommandError(
                f"The database {alias!r} has unapplied migrations ({pending}{', ...' if len(plan) > 5 else ''}). "
                f"Run `python manage.py migrate` before starting an engine."
            )

    def _install_signal_handlers(self, engine: Any) -> None:
        state = {"signals": 0}

        def handler(signum: int) -> None:
            state["signals"] += 1
            if state["signals"] == 1:
                logging.getLogger("weft_django").warning(
                    "draining engine=%s signal=%s (send it again to force exit)",
                    engine.engine_id,
                    signal.Signals(signum).name,
                )
                engine.request_stop()
            else:
                sys.stderr.write("weft_engine: forced exit\n")
                os._exit(1)

        on_signals(handler)

    def _configure_logging(self, verbosity: int) -> None:
        log = logging.getLogger("weft_django")
        log.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
        if not log.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
            log.addHandler(handler)


ENGINE_OPTIONS = ("once", "processes", "queues", "concurrency", "engine_id", "metrics_port")
PROCESS_SUFFIX = 16  # room for "-<slot>.<restarts>" on the ids of --processes' children


def refuse_conflicting_options(options: dict[str, Any]) -> None:
    """Raise CommandError for options that do not go together, or an --engine-id the engine table
    cannot store (checked like a workflow id: 1 to 255 characters, no control character, no lone
    surrogate), before anything is read or written.

    Args:
        options: the command's parsed options.
    """
    from ...exceptions import InvalidArgumentError
    from ...validation import MAX_ID_LENGTH, check_text

    if options["force"] and not options["reset_ownership_mode"]:
        raise CommandError("--force only applies to --reset-ownership-mode: drop it to run an engine.")
    if options["reset_ownership_mode"]:
        defaults = {"processes": 1, "once": False}  # the others default to None
        given = [name for name in ENGINE_OPTIONS if options[name] != defaults.get(name)]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise CommandError(
                f"--reset-ownership-mode clears the ownership mode marker and exits without running an engine: "
                f"drop {flags}."
            )
    engine_id = options["engine_id"]
    if engine_id is None:
        return
    several = options["processes"] > 1
    longest = MAX_ID_LENGTH - PROCESS_SUFFIX if several else MAX_ID_LENGTH
    hint = f" With --processes the children add -<n> to it: {longest} at most." if several else ""
    try:
        check_text(engine_id, "--engine-id", max_length=longest, controls=True, hint=hint)
    except InvalidArgumentError as exc:
        raise CommandError(str(exc)) from None


def freeze_startup_objects(engine_id: str) -> None:
    """Move every object alive before the engine's first pass (Django, the app registry, the
    workflow modules: tens of thousands) out of the cyclic garbage collector's reach, as the
    ``gc.freeze`` documentation suggests for long-running processes. They live as long as the
    process, yet each full collection walked them all: 50-80 ms pauses of the engine's loop, several
    per 10,000 workflows drained (docs/benchmarks.md, session 22). Reference counting still frees
    them; only cycles among them are kept, which start-up state does not make.

    Args:
        engine_id: the engine's id, for the debug log line.
    """
    gc.collect()
    gc.freeze()
    logging.getLogger("weft_django").debug(
        "start-up objects frozen engine=%s objects=%d", engine_id, gc.get_freeze_count()
    )


def set_switch_interval(engine_id: str, interval: timedelta | None) -> None:
    """Give this process WEFT["ENGINE_SWITCH_INTERVAL"] as the interpreter's thread switch interval
    (``sys.setswitchinterval``; None leaves Python's own, 5 ms). A thread whose database call returned
    (the commit thread beside the loop's claim ahead, the LISTEN thread, an activity's) waits for the
    interpreter lock until the running thread drops it: with a busy loop, up to one interval per round
    trip. At 1 ms the commit beside the claim ahead took about a fifth less time (docs/benchmarks.md,
    session 27). Only ``weft_engine`` sets it: the engine's process is its own.

    Args:
        engine_id: the engine's id, for the debug log line.
        interval: the switch interval, or None.
    """
    if interval is not None:
        sys.setswitchinterval(interval.total_seconds())
    logging.getLogger("weft_django").debug(
        "thread switch interval engine=%s seconds=%s", engine_id, sys.getswitchinterval()
    )


def on_signals(callback: Callable[[int], None]) -> None:
    """Call ``callback(signum)`` for each SIGTERM and SIGINT, on a thread of its own.

    A Python signal handler runs on the main thread between two of its bytecodes, maybe while that
    thread holds a lock: the engine loop holds its wake-up Event's inside ``Event.wait``, and stopping
    the engine sets that Event (it takes the lock): run there, the handler waited for its own thread for
    ever. So the handlers installed here do nothing; the C-level handler writes each signal's number to a
    pipe (``signal.set_wakeup_fd``), read by the thread, which also acts while the main thread is stuck
    in a call that does not return. Call from the main thread.

    A process forked from this one without exec (an activity's ``multiprocessing`` pool or process:
    the "fork" start method, Linux's default before Python 3.14) inherits that handler and that pipe:
    its SIGTERM (``Process.terminate()``, ``Pool.__exit__``) was read here as the engine's own (it
    drained; two forced its exit) and the child ignored it. A forked child gets Python's default
    handling back (``_forget_in_child``).
    """
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_main_thread)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if _wakeup_fd[0] is None:
        os.register_at_fork(after_in_child=_forget_in_child)
    _wakeup_fd[0] = write_end

    def follow() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while data := pipe.read(64):
                for signum in data:
                    if signum in (signal.SIGTERM, signal.SIGINT):
                        callback(signum)

    threading.Thread(target=follow, name="weft-signals", daemon=True).start()


def _on_main_thread(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's and SIGINT's Python handler: nothing (``on_signals``' thread acts on them)."""


_wakeup_fd: list[int | None] = [None]  # the one on_signals set in this process (None: not called)


def _forget_in_child() -> None:
    """In a child forked (without exec) from an engine process: no wakeup fd into the engine's pipe, and
    Python's default SIGTERM and SIGINT handling (not the engine's or its supervisor's handlers, which
    do nothing in such a child), so a signal to the child is the child's own."""
    current = signal.set_wakeup_fd(-1)
    if current != _wakeup_fd[0]:  # set by someone else since: theirs
        signal.set_wakeup_fd(current)
    if signal.getsignal(signal.SIGTERM) is _on_main_thread:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is _on_main_thread:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def banner(engine: Any, metrics_url: str | None) -> str:
    """The start-up banner: who this engine is and what it runs against, before it claims anything."""
    from ... import __version__
    from ...registry import registry

    connection = connections[engine.using]
    settings = engine.settings
    database = connection.settings_dict.get("NAME")
    host = connection.settings_dict.get("HOST")
    where = f"{backend(engine.using).display_name} {database}" + (f" on {host}" if host else "")
    if engine.mode == "workflow-lease":
        claim = settings.workflow_claim_ttl, settings.workflow_claim_renew_interval
        ttl = f"claim ttl={_seconds(claim[0])} renew={_seconds(claim[1])}"
    elif engine.mode == "lease":
        ttl = f"store lease ttl={_seconds(settings.lease_ttl)} renew={_seconds(settings.lease_renew_interval)}"
    else:
        ttl = "no lease (single engine)"
    lines = [
        f"weft_engine {__version__}",
        f"  engine       {engine.engine_id} (host {socket.gethostname()}, pid {os.getpid()})",
        f"  ownership    {engine.mode}: {ttl}",
        f"  concurrency  {engine.concurrency} activity threads ({settings.activity_executor}), "
        f"claim batch {settings.claim_batch_size}, poll {_seconds(settings.poll_interval)}",
        f"  database     {where} (alias {engine.using!r})",
        f"  workflows    {len(registry.latest)} registered type(s), {len(registry.workflows)} version(s)",
    ]
    if metrics_url:
        lines.append(f"  metrics      {metrics_url}")
    return "\n".join(lines)


def _seconds(delta: Any) -> str:
    return f"{delta.total_seconds():g}s"


class StatusReporter:
    """Logs one line every ``interval`` seconds (logger weft_django.engine.status, INFO): claims held,
    running activity attempts, what was committed since the last line, timers due and how late."""

    def __init__(self, engine: Any, interval: float) -> None:
        from ... import events

        self.engine = engine
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weft-status", daemon=True)
        self._previous = events.stats(engine.engine_id).snapshot()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    status_logger.info(self.line())
                except Exception as exc:  # the status line must never take the engine down
                    status_logger.warning("status line failed engine=%s error=%s", self.engine.engine_id, exc)
                    connections[self.engine.using].close()
        finally:
            connections[self.engine.using].close()

    def line(self) -> str:
        from django.db.models import Count, Min

        from ... import events
        from ...models import Timer
        from ...store.clock import db_now

        engine = self.engine
        now = db_now(engine.using)
        due = Timer.objects.using(engine.using).filter(fire_at__lte=now).aggregate(n=Count("id"), oldest=Min("fire_at"))
        lag = (now - due["oldest"]).total_seconds() if due["oldest"] is not None else 0.0
        current = events.stats(engine.engine_id).snapshot()
        before, self._previous = self._previous, current
        return (
            f"status engine={engine.engine_id} claims={len(engine.owned)} "
            f"activities={len(engine.executor.running)} "
            f"steps=+{current.steps_committed - before.steps_committed} "
            f"steps_failed=+{current.steps_failed - before.steps_failed} "
            f"finished=+{current.workflows_finished - before.workflows_finished} "
            f"failed=+{current.workflows_failed - before.workflows_failed} "
            f"acquired=+{current.claims_acquired - before.claims_acquired} "
            f"takeovers=+{current.claims_taken_over - before.claims_taken_over} "
            f"lost=+{current.claims_lost - before.claims_lost} "
            f"refused=+{current.commits_refused - before.commits_refused} "
            f"renew_failures=+{current.renewal_failures - before.renewal_failures} "
            f"timers_due={due['n']} lag={lag:.1f}s"
        )
