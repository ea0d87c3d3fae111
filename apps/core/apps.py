from django.apps import AppConfig
from django.db.models import Field, ForeignObject


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"

    def ready(self):
        from apps.core.bulk import Among

        Field.register_lookup(Among)
        ForeignObject.register_lookup(Among)  # relations keep lookups of their own
