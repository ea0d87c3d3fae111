from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "apps.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"

    def ready(self):
        from django.contrib.auth.signals import user_logged_out

        from apps.dashboard.receivers import end_live_session

        user_logged_out.connect(end_live_session, dispatch_uid="dashboard.end_live_session")
