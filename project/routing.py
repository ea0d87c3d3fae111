"""Websocket routes; the dashboard's live consumer registers here."""

websocket_urlpatterns: list = []
