"""Settings for the benchmarks: PostgreSQL database ``weft_bench`` (dropped and re-created by each run).

Override the connection with WEFT_BENCH_PG_HOST / _PORT / _USER / _NAME.
"""

import os

SECRET_KEY = "weft-benchmarks"  # noqa: S105
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
    }
}

WEFT = {"POLL_INTERVAL": "100ms"}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "weft_django": {"handlers": ["console"], "level": os.environ.get("WEFT_LOG_LEVEL", "WARNING")},
    },
}
