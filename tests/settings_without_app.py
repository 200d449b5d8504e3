"""The test settings without "weft_django" in INSTALLED_APPS: a new project that forgot it
(tests/project/test_new_user.py)."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in ("weft_django", "tests.testapp")]
TASKS: dict[str, object] = {}
