from django.db import migrations, models


class Migration(migrations.Migration):
    """trace_context on Workflow, BufferedSignal and PendingUpdate: the W3C trace context of the
    start, signal or update that wrote the row (weft_django.tracing), so the engine's and the workers'
    spans join the caller's trace. Nullable text with no default: a catalog change on PostgreSQL (no
    table rewrite); rows written without tracing, and existing rows, hold NULL."""

    dependencies = [
        ("weft_django", "0010_claim_last_engine"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflow",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="bufferedsignal",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="pendingupdate",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
    ]
