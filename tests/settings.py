"""Settings for the test suite. WEFT_TEST_DB=postgres (default) or sqlite."""

import json
import os

SECRET_KEY = "weft-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "weft_django",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"

TEST_DB = os.environ.get("WEFT_TEST_DB", "postgres")
if TEST_DB == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("WEFT_SQLITE_PATH", "/tmp/weft-tests.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                # busy timeout; an engine subprocess's own through WEFT_SQLITE_TIMEOUT (tests that outlast it)
                "timeout": float(os.environ.get("WEFT_SQLITE_TIMEOUT", "20")),
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            # A file, not :memory:, so engine subprocesses share it.
            "TEST": {"NAME": os.environ.get("WEFT_SQLITE_TEST_PATH", "/tmp/weft-tests-test.sqlite3")},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("WEFT_PG_NAME", "weft"),
            "USER": os.environ.get("WEFT_PG_USER", "postgres"),
            "HOST": os.environ.get("WEFT_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("WEFT_PG_PORT", "5432"),
        }
    }

WEFT = {"POLL_INTERVAL": "100ms"}
# Engine subprocesses started by tests take their WEFT overrides from here (JSON).
WEFT.update(json.loads(os.environ.get("WEFT_TEST_OVERRIDES", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"weft_django": {"handlers": ["console"], "level": os.environ.get("WEFT_LOG_LEVEL", "WARNING")}},
}

# django.tasks (Django 6.0+) or the django-tasks backport (5.2) on weft: tests/client/test_tasks.py.
TASKS = {
    "default": {
        "BACKEND": "weft_django.tasks.WeftBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"RETRY": {"max_attempts": 3, "initial_backoff": "10ms", "max_backoff": "50ms"}},
    },
    "once": {
        "BACKEND": "weft_django.tasks.WeftBackend",
        "OPTIONS": {"RETRY": {"max_attempts": 1}, "TIMEOUT": "30s"},
    },
}
