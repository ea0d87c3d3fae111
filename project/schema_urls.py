"""The URLs the OpenAPI schema documents: the project's, and the agents' routes that
agentapi answers in front of Django (declared for the schema alone)."""

from django.urls import include, path

from project.urls import urlpatterns as project_urlpatterns

urlpatterns = [*project_urlpatterns, path("api/v1/", include("agentapi.openapi"))]
