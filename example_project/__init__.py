"""An example Django project that uses weft_django (run it with ./scripts/demo)."""

# Load the Celery app whenever Django starts (engines send activities through it, and
# `celery -A example_project` finds it here). Celery is optional: without it the demo runs activities
# in the engine's thread pool.
try:
    from .celery import app as celery_app
except ImportError:
    celery_app = None

__all__ = ["celery_app"]
