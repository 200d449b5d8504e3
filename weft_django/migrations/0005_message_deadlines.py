from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("weft_django", "0004_schedule_next_nominal"),
    ]

    operations = [
        migrations.AddField(
            model_name="pendingupdate",
            name="deadline",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queryrequest",
            name="deadline",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="pendingupdate",
            name="status",
            field=models.CharField(
                choices=[
                    ("admitted", "Admitted"),
                    ("accepted", "Accepted"),
                    ("rejected", "Rejected"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("expired", "Expired"),
                ],
                default="admitted",
                max_length=16,
            ),
        ),
    ]
