"""Settings for the benchmarks: PostgreSQL database ``weft_bench`` (dropped and re-created by each run).

Override the connection with WEFT_BENCH_PG_HOST / _PORT / _USER / _NAME. WEFT_BENCH_CONN_MAX_AGE sets
CONN_MAX_AGE ("none" = persistent connections; default 0, Django's default), which ``run.py
--conn-max-age`` sets for the benchmark process and the engine alike. WEFT_BENCH_OVERRIDES, a JSON
object, is merged into WEFT: ``run.py`` sets it for each engine subprocess (ownership mode, claim
TTL and renew interval, ``--weft KEY=VALUE``).
"""

import json
import os


def _conn_max_age() -> int | None:
    value = os.environ.get("WEFT_BENCH_CONN_MAX_AGE", "0").strip().lower()
    return None if value in ("none", "") else int(value)


SECRET_KEY = "weft-benchmarks"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "weft_django",
    "benchmarks.benchapp",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("WEFT_BENCH_PG_NAME", "weft_bench"),
        "USER": os.environ.get("WEFT_BENCH_PG_USER", "postgres"),
        "HOST": os.environ.get("WEFT_BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("WEFT_BENCH_PG_PORT", "5432"),
        "CONN_MAX_AGE": _conn_max_age(),
    }
}

WEFT = {"POLL_INTERVAL": "100ms", **json.loads(os.environ.get("WEFT_BENCH_OVERRIDES") or "{}")}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"stamped": {"format": "%(asctime)s %(levelname)s %(threadName)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "stamped"}},
    "loggers": {
        "weft_django": {"handlers": ["console"], "level": os.environ.get("WEFT_LOG_LEVEL", "WARNING")},
    },
}
