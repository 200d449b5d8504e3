from django.db import migrations, models


class Migration(migrations.Migration):
    """WorkflowClaim.last_engine_id: the engine that last took the claim, written with engine_id by
    every statement that makes an engine the holder and kept when the holder releases it (the terminal
    commit, a drain), so a finished run's claim still names the engine that ran it to its end. Nullable
    and unindexed: adding it is a catalog change on PostgreSQL (no table rewrite), and renewals, which
    rewrite only expires_at, stay HOT updates. Existing claims start with no value."""

    dependencies = [
        ("weft_django", "0009_claim_runnable"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowclaim",
            name="last_engine_id",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
    ]
