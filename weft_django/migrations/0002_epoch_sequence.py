"""Epochs come from one global sequence on PostgreSQL, so they never repeat for a workflow id across
release, purge and reuse. SQLite uses the one-row EpochCounter instead."""

from django.db import migrations


def create_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE SEQUENCE IF NOT EXISTS weft_django_epoch_seq")


def drop_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP SEQUENCE IF EXISTS weft_django_epoch_seq")


class Migration(migrations.Migration):
    dependencies = [("weft_django", "0001_initial")]
    operations = [migrations.RunPython(create_sequence, drop_sequence, elidable=False)]
