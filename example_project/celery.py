"""The example project's Celery app (optional: ``pip install 'weft-django[celery]'``).

Run an engine and a worker side by side, with ``WEFT_ACTIVITY_EXECUTOR=celery`` for both::

    python manage.py weft_engine                     # owns workflows, sends their activities
    celery -A example_project worker -l INFO         # runs them (as many workers as you like)

Hosts with ``WEFT["BACKGROUND_TASKS"] = "manual"`` (no long-running engine) run the engine pass from
celery beat instead: ``celery -A example_project beat`` with the CELERY_BEAT_SCHEDULE in settings.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

# weft_django.contrib.celery defines the tasks weft sends (weft_django.run_activity) and the
# maintenance task; autodiscover_tasks() finds the project's own tasks.py modules.
app = Celery("example_project", include=["weft_django.contrib.celery"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
