"""ASGI entry point: HTTP through project.stack (the agents' routes, bounded bodies,
admission into Django), websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from project import gc_tuning  # noqa: E402
from project.origins import SameOriginWebsockets  # noqa: E402
from project.refusals import WebsocketRefusals  # noqa: E402
from project.routing import websocket_urlpatterns  # noqa: E402
from project.stack import http_stack  # noqa: E402

http_application = http_stack(django_asgi_app)

application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": WebsocketRefusals(SameOriginWebsockets(AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ))),
    }
)

gc_tuning.install()  # last: everything built while starting is frozen
