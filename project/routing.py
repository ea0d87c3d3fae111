"""Websocket routes: the dashboard's live consumer."""

from django.urls import path

from apps.dashboard.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
]
