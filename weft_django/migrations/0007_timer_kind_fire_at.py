from django.db import migrations, models


class Migration(migrations.Migration):
    """Index timers by (kind, fire_at): the delayed-start due scan stays bounded by the due delayed
    starts, however many past-due timers of other kinds exist (benchmarks, scenario ``timers``)."""

    dependencies = [
        ("weft_django", "0006_remote_attempts"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="timer",
            index=models.Index(fields=["kind", "fire_at"], name="weft_timer_kind_fire_at"),
        ),
    ]
