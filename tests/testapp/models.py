from django.db import models


class ActivityCall(models.Model):
    """One row per activity invocation: tests count them across processes."""

    name = models.CharField(max_length=100)
    key = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name}({self.key})"


class Reservation(models.Model):
    order_id = models.IntegerField()

    def __str__(self) -> str:
        return str(self.order_id)
