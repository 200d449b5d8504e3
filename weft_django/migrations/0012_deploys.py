import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Safe deploys (issue 18): the \"patch\" step kind of ctx.patched (a choices change: no
    schema change on either database), and ContinuedRun, the chain of runs of ctx.continue_as_new (a
    new table)."""

    dependencies = [
        ("weft_django", "0011_trace_context"),
    ]

    operations = [
        migrations.AlterField(
            model_name="step",
            name="kind",
            field=models.CharField(
                choices=[
                    ("activity", "Activity"),
                    ("sleep", "Sleep"),
                    ("signal", "Wait for signal"),
                    ("update", "Wait for update"),
                    ("wait_until", "Wait until"),
                    ("memo", "Memo"),
                    ("child", "Child workflow"),
                    ("all", "All"),
                    ("race", "Race"),
                    ("patch", "Patch marker"),
                ],
                max_length=16,
            ),
        ),
        migrations.CreateModel(
            name="ContinuedRun",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("run_id", models.UUIDField(unique=True)),
                ("next_run_id", models.UUIDField(unique=True)),
                ("workflow_type", models.CharField(max_length=255)),
                ("version", models.CharField(max_length=64)),
                ("input", models.TextField(help_text="Codec text of the run's {'args', 'kwargs'}.")),
                ("steps", models.PositiveIntegerField(default=0, help_text="How many steps the run recorded.")),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField()),
                (
                    "workflow",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="weft_django.workflow",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["workflow", "finished_at"], name="weft_continued_chain")],
            },
        ),
    ]
