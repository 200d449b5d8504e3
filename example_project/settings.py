"""Settings for the example project.

Every value can come from the environment, read with django-environ. The defaults run the demo
on a local SQLite file with no server:

    DATABASE_URL=sqlite:////path/to/db.sqlite3     (default: db.sqlite3 next to manage.py)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/weft_example
    DEBUG=true  SECRET_KEY=...  ALLOWED_HOSTS=example.com,www.example.com
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="weft-example-insecure-dev-key")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "weft_django",
    "example_project.shop",
]
if DEBUG:
    try:
        import django_extensions  # noqa: F401  (optional: shell_plus, show_urls, ...)
    except ImportError:
        pass
    else:
        INSTALLED_APPS.append("django_extensions")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # What weft needs from SQLite: WAL so readers never block the engine's writer, IMMEDIATE
    # transactions so two writers queue instead of failing with "database is locked" on upgrade,
    # and a busy timeout long enough for the engine's short transactions.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# weft_django: one dict, read lazily; every key is optional (see docs/settings.md).
WEFT = {
    # Upper bound on wake-up latency when no notification arrives. SQLite has no LISTEN/NOTIFY, so
    # the demo polls; 200ms keeps it snappy. The default is "1s".
    "POLL_INTERVAL": env.str("WEFT_POLL_INTERVAL", default="200ms"),
    # Activities run in the engine's thread pool. WEFT_ACTIVITY_EXECUTOR=celery sends them to Celery
    # workers instead (example_project/celery.py; `celery -A example_project worker`, docs/celery.md).
    "ACTIVITY_EXECUTOR": env.str("WEFT_ACTIVITY_EXECUTOR", default="threads"),
}

# Celery, read by example_project/celery.py (config_from_object("django.conf:settings",
# namespace="CELERY")). weft's own tasks set acks_late and reject_on_worker_lost themselves.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=None)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Only for WEFT["BACKGROUND_TASKS"] = "manual": one engine pass every few seconds from celery beat.
CELERY_BEAT_SCHEDULE = {
    "weft-maintenance": {"task": "weft_django.run_maintenance", "schedule": 5.0, "options": {"expires": 5.0}}
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "weft_django": {"handlers": ["console"], "level": env.str("WEFT_LOG_LEVEL", default="INFO")},
        "example_project": {"handlers": ["console"], "level": "INFO"},
    },
}

# The demo runs one engine on SQLite, which is what weft.W003 warns about; keep its output quiet.
SILENCED_SYSTEM_CHECKS = ["weft.W003"]
