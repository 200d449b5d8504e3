"""The Celery app of the test workers: ``celery -A tests.celery_app worker``.

With WEFT_TEST_DATABASE_NAME set, the worker uses that database (the test database of the pytest run
that started it), set before django.setup() as weft_django.testing does for engine subprocesses. The
tasks below start and signal workflows from inside Celery tasks.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery_settings")

import django
from celery import Celery
from django.apps import apps
from django.conf import settings

if not apps.ready:
    if os.environ.get("WEFT_TEST_DATABASE_NAME"):
        settings.DATABASES["default"]["NAME"] = os.environ["WEFT_TEST_DATABASE_NAME"]
    django.setup()

from tests import celery_settings

app = Celery("weft_tests", include=["weft_django.contrib.celery"])
app.config_from_object(celery_settings, namespace="CELERY")


@app.task(name="tests.start_workflow")
def start_workflow(workflow_type: str, args: list[Any], workflow_id: str) -> str:
    import weft_django as weft

    return weft.start(workflow_type, args=args, id=workflow_id).id


@app.task(name="tests.signal_workflow")
def signal_workflow(workflow_id: str, name: str, payload: Any) -> None:
    import weft_django as weft

    weft.get_handle(workflow_id).signal(name, payload)
