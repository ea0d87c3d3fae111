"""WSGI entry point (HTTP only; production serves ASGI for websockets). Request
bodies are bounded while they are read (project/bodylimits.py)."""

import os

from django.core.wsgi import get_wsgi_application

from project.bodylimits import BoundedBodyWSGI

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = BoundedBodyWSGI(get_wsgi_application())
