from django.apps import AppConfig


class ReleasesConfig(AppConfig):
    name = "apps.releases"
    label = "releases"
    verbose_name = "Releases"
