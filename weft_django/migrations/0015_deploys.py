from django.db import migrations, models


class Migration(migrations.Migration):
    """Safe deploys (issue 18): the \"patch\" step kind of ctx.patched (a choices change: no
    schema change on either database)."""

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
    ]
