"""ASGI entry point: HTTP through Django, websockets through Channels. The agent's
poll, a snapshot's bundle and reports are answered in front of Django alone
(agentapi: cached.py, desired.py, bundle.py, reports.py). Request bodies
are bounded while they are received (project/bodylimits.py), and requests enter
Django a few at a time per process (project/admission.py); a refused websocket
handshake is answered 403 (project/refusals.py). The garbage collector is tuned
for the many objects of held long-polls (project/gc_tuning.py)."""

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
