"""The built-in rollout strategies: global (no tenant) and read-only. Their
definitions are copied here, not imported, so this migration never changes."""

from django.db import migrations

BUILTIN = [
    ("canary-then-10-percent", "One canary, then 10 %, then all; each wave bakes 10 minutes "
     "behind an automatic gate.",
     {"canary": {"count": 1}, "canary_gate": "auto", "bake_s": 600,
      "waves": [{"percent": 10, "gate": "auto", "bake_s": 600},
                {"percent": 100, "gate": "auto", "bake_s": 600}]}),
    ("linear-20-percent", "20 % of the agents every 5 minutes, automatically.",
     {"canary": {"percent": 20}, "canary_gate": "auto", "bake_s": 300,
      "waves": [{"percent": 20, "gate": "auto", "bake_s": 300}] * 4}),
    ("all-at-once", "Every agent at once, no bake.",
     {"canary": {"percent": 100}, "canary_gate": "auto", "bake_s": 0,
      "waves": [{"percent": 100, "gate": "auto", "bake_s": 0}]}),
    ("careful", "One canary an operator confirms; then 25 % and the rest, 10 agents "
     "applying at a time, each wave stopping after 2 failures.",
     {"canary": {"count": 1}, "canary_gate": "manual", "bake_s": 0, "failure_threshold": 10,
      "waves": [{"percent": 25, "gate": "auto", "bake_s": 600, "max_in_flight": 10,
                 "max_failures": 2},
                {"percent": 100, "gate": "auto", "bake_s": 600, "max_in_flight": 10,
                 "max_failures": 2}]}),
]


def seed(apps, schema_editor):
    Strategy = apps.get_model("rollouts", "RolloutStrategy")
    for name, description, definition in BUILTIN:
        Strategy.objects.update_or_create(tenant=None, name=name, defaults={
            "description": description, "definition": definition})


def unseed(apps, schema_editor):
    apps.get_model("rollouts", "RolloutStrategy").objects.filter(
        tenant=None, name__in=[name for name, _, _ in BUILTIN]).delete()


class Migration(migrations.Migration):
    dependencies = [("rollouts", "0007_strategies")]
    operations = [migrations.RunPython(seed, unseed)]
