import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """WorkflowAttribute: the search attributes of a workflow's latest run (issue 19, ADR 0010), one
    typed column per row, with a partial btree index of (name, value, workflow) per type. A new table:
    no rewrite of existing ones."""

    dependencies = [
        ("weft_django", "0012_deploys"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowAttribute",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=100)),
                ("position", models.PositiveSmallIntegerField(default=0)),
                ("kind", models.CharField(max_length=16)),
                ("str_value", models.CharField(blank=True, max_length=500, null=True)),
                ("num_value", models.FloatField(blank=True, null=True)),
                ("time_value", models.DateTimeField(blank=True, null=True)),
                ("bool_value", models.BooleanField(blank=True, null=True)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="weft_django.workflow",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("str_value__isnull", False)),
                        fields=["name", "str_value", "workflow"],
                        name="weft_attr_str",
                    ),
                    models.Index(
                        condition=models.Q(("num_value__isnull", False)),
                        fields=["name", "num_value", "workflow"],
                        name="weft_attr_num",
                    ),
                    models.Index(
                        condition=models.Q(("time_value__isnull", False)),
                        fields=["name", "time_value", "workflow"],
                        name="weft_attr_time",
                    ),
                    models.Index(
                        condition=models.Q(("bool_value__isnull", False)),
                        fields=["name", "bool_value", "workflow"],
                        name="weft_attr_bool",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("workflow", "name", "position"), name="weft_attr_wf_name_pos")
                ],
            },
        ),
    ]
