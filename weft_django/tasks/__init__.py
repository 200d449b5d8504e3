"""weft_django.tasks: a durable backend for Django's Tasks framework.

``TASKS = {"default": {"BACKEND": "weft_django.tasks.WeftBackend", "OPTIONS": {...}}}`` (Django 6.0+
``django.tasks``; on Django 5.2 the ``django-tasks`` backport). See docs/tasks.md.
"""

from __future__ import annotations

from .backend import WeftBackend
from .names import ACTIVITY_NAME, WORKFLOW_NAME

__all__ = ["ACTIVITY_NAME", "WORKFLOW_NAME", "WeftBackend"]
