"""Views a project can mount. ``metrics``: Prometheus exposition for the web process.

    # urls.py
    from weft_django.views import metrics
    urlpatterns = [path("metrics", metrics)]

It serves prometheus_client's default registry plus ``weft_workflows{status,workflow_type}`` (counted
when scraped). It has no authentication of its own: restrict it as you would any internal endpoint
(a network policy, or wrap it, e.g. ``staff_member_required(metrics)``).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from . import metrics as _metrics


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _metrics.AVAILABLE:
        return HttpResponse(_metrics.INSTALL_HINT + "\n", status=501, content_type="text/plain; charset=utf-8")
    body, content_type = _metrics.exposition(request.headers.get("Accept"))
    return HttpResponse(body, content_type=content_type)
