from django.db import migrations, models

# Literal values: a migration must not import code that may change later.
_NOT_RUNNABLE = ("completed", "failed", "cancelled", "timed_out", "suspended")
_STATS = "weft_claim_free_stats"


def _mark_not_runnable(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Claims of terminal and suspended runs are not claimable (the column was added as True);
    every claim gets its run's created_at."""
    alias = schema_editor.connection.alias
    Workflow = apps.get_model("weft_django", "Workflow")
    WorkflowClaim = apps.get_model("weft_django", "WorkflowClaim")
    idle = Workflow.objects.using(alias).filter(status__in=_NOT_RUNNABLE).values("id")
    WorkflowClaim.objects.using(alias).filter(workflow_id__in=idle).update(runnable=False)
    created = Workflow.objects.using(alias).filter(pk=models.OuterRef("pk")).values("created_at")[:1]
    WorkflowClaim.objects.using(alias).update(run_created_at=models.Subquery(created))


def _create_statistics(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE STATISTICS IF NOT EXISTS {_STATS} (mcv) ON engine_id, runnable FROM weft_django_workflowclaim"
        )


def _drop_statistics(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {_STATS}")


class Migration(migrations.Migration):
    """WorkflowClaim.runnable and run_created_at, and the partial index weft_claim_free on
    run_created_at (unheld AND runnable): acquire reads the oldest claimable rows in index order
    instead of walking every running workflow or every unheld claim, which includes every finished
    run's claim until retention purges it (docs/benchmarks.md, "Scale"). The engine index becomes partial
    (held claims only: renewal and the fence look claims up by holder), and on PostgreSQL joint
    statistics of (engine_id, runnable) let the planner see how few unheld claims are runnable.
    The data step runs before the index is built. Reversible: going back drops the column, the
    indexes and the statistics and restores the full engine index."""

    dependencies = [
        ("weft_django", "0008_claim_fillfactor"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowclaim",
            name="runnable",
            field=models.BooleanField(db_default=True, default=True),
        ),
        migrations.AddField(
            model_name="workflowclaim",
            name="run_created_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(_mark_not_runnable, migrations.RunPython.noop, elidable=False),
        migrations.AddIndex(
            model_name="workflowclaim",
            index=models.Index(
                condition=models.Q(("engine_id__isnull", True), ("runnable", True)),
                fields=["run_created_at"],
                name="weft_claim_free",
            ),
        ),
        migrations.RemoveIndex(model_name="workflowclaim", name="weft_claim_engine"),
        migrations.AddIndex(
            model_name="workflowclaim",
            index=models.Index(
                condition=models.Q(("engine_id__isnull", False)), fields=["engine_id"], name="weft_claim_holder"
            ),
        ),
        migrations.RunPython(_create_statistics, _drop_statistics, elidable=False),
    ]
