from django.db import migrations, models

# The ``varchar_pattern_ops`` twin Django's PostgreSQL backend adds beside the index of every indexed
# CharField (the ``..._like`` indexes), kept only where weft queries by prefix: ``weft_django_workflow.id``
# (``weft.list_workflows(id_prefix=...)``, store/visibility.py). weft looks the other columns up by
# equality, and the admin's search (``icontains``) cannot use such an index.
KEPT = {("weft_django_workflow", "id")}
TABLES = (
    "weft_django_appliedupdate",
    "weft_django_bufferedsignal",
    "weft_django_continuedrun",
    "weft_django_engine",
    "weft_django_idempotencykey",
    "weft_django_pendingupdate",
    "weft_django_queryrequest",
    "weft_django_remoteattempt",
    "weft_django_schedule",
    "weft_django_step",
    "weft_django_timer",
    "weft_django_workflow",
    "weft_django_workflowclaim",
)


def drop_pattern_indexes(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return  # only PostgreSQL's backend makes them
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname, t.relname, a.attname FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0] "
            "JOIN pg_opclass o ON o.oid = x.indclass[0] "
            "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname = ANY(%s) "
            "AND x.indnatts = 1 AND o.opcname IN ('varchar_pattern_ops', 'text_pattern_ops')",
            [list(TABLES)],
        )
        found = cursor.fetchall()
    for index, table, column in found:
        if (table, column) not in KEPT:
            schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(index)}")


class Migration(migrations.Migration):
    """Fewer indexes to write on every start and every commit (PostgreSQL): Django's prefix-search
    twins of the indexed text columns, which no weft query uses (docs/decisions/0013), and the plain
    index on ``Timer.workflow``, which ``weft_timer_wf`` (workflow, fire_at) covers. Reversing leaves
    them dropped (nothing reads them)."""

    dependencies = [
        ("weft_django", "0015_workflow_execution_timeout"),
    ]

    operations = [
        migrations.RunPython(drop_pattern_indexes, migrations.RunPython.noop, elidable=False),
        migrations.AlterField(
            model_name="timer",
            name="workflow",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=models.deletion.CASCADE,
                related_name="timers",
                to="weft_django.workflow",
            ),
        ),
    ]
