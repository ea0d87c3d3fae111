"""runserver: Daphne's (HTTP + websockets), plus the periodic loop in embedded mode."""

from daphne.management.commands.runserver import Command as DaphneRunserver
from django.conf import settings

from project.embedded import start_periodic_loop


class Command(DaphneRunserver):
    help = (
        "Serve HTTP and websockets for development. In embedded mode (no broker, "
        "tasks inline) it also runs the Celery beat schedule in-process."
    )

    def inner_run(self, *args, **options):
        if settings.CELERY_TASK_ALWAYS_EAGER:
            start_periodic_loop()
        return super().inner_run(*args, **options)
