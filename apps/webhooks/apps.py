from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "apps.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"

    def ready(self):
        from apps.core.events import subscribe
        from apps.webhooks.services import event_record

        # Domain events are recorded as deliveries in the announcing transaction.
        subscribe(event_record)
