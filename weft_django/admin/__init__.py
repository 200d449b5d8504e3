"""weft's Django admin: read-only views of engine-owned state; actions go through the public API.

The ModelAdmins register only when django.contrib.admin is installed, so ``health`` and
``terminal`` (shared with ``manage.py weft``) import in projects without the admin too.
"""

from django.apps import apps

if apps.is_installed("django.contrib.admin"):
    from . import readonly, schedules, workflows  # noqa: F401  (register the ModelAdmins)
