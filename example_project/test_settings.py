"""Settings for the example project's own tests (``pytest example_project --ds=example_project.test_settings``).

The project's settings, plus what weft's test kit needs: on SQLite a test database in a file rather
than in memory, so engine subprocesses and the in-process engine's own connections share it, and a
short poll interval so engines notice work quickly.
"""

import os

from .settings import *  # noqa: F403
from .settings import BASE_DIR, DATABASES, WEFT

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("EXAMPLE_SQLITE_TEST_PATH", str(BASE_DIR / "test.sqlite3"))}
WEFT = {**WEFT, "POLL_INTERVAL": "100ms"}
SILENCED_SYSTEM_CHECKS = ["weft.W003"]
