"""Settings for the Celery tests' subprocesses (engines and workers): the test settings plus a broker.

The broker is a dedicated Redis database (WEFT_TEST_CELERY_BROKER, default redis://127.0.0.1:6379/13);
this run's keys (BROKER_KEY_PREFIX) are deleted before and after each test. Engines find it through
these CELERY_* keys (weft_django.contrib.celery builds an app from them when the process loaded
none); workers run tests/celery_app.py.
"""

import os

from tests.settings import *  # noqa: F403

CELERY_BROKER_URL = os.environ.get("WEFT_TEST_CELERY_BROKER", "redis://127.0.0.1:6379/13")
# Every key of this run carries a prefix naming its database, so two suites running at once (the
# PostgreSQL and SQLite runs, or two checkouts) never deliver to each other's workers or empty each
# other's queues.
BROKER_KEY_PREFIX = "weft-tests:{}:{}:".format(
    os.environ.get("WEFT_TEST_DB", "postgres"),
    os.environ.get("WEFT_PG_NAME", "weft")
    if os.environ.get("WEFT_TEST_DB", "postgres") == "postgres"
    else os.environ.get("WEFT_SQLITE_TEST_PATH", "/tmp/weft-tests-test.sqlite3"),
)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"global_keyprefix": BROKER_KEY_PREFIX}
CELERY_TASK_DEFAULT_QUEUE = "weft-tests"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if os.environ.get("WEFT_TEST_CELERY_VISIBILITY"):
    # A worker that hands out unacknowledged messages of dead workers again after this many seconds
    # (Redis's default is an hour), checked every second.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        **CELERY_BROKER_TRANSPORT_OPTIONS,
        "visibility_timeout": float(os.environ["WEFT_TEST_CELERY_VISIBILITY"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
