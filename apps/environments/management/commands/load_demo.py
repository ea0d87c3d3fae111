"""manage.py load_demo: an idempotent demo tenant, application and environments."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from apps.environments.models import Environment, PlatformPolicy
from apps.environments.services import environment_create, environment_file_put, policy_publish
from apps.releases.publishing import publication_complete
from apps.releases.services import environment_update, snapshot_activate, snapshot_publish
from apps.tenancy.models import Application, Role, Tenant
from apps.tenancy.services import application_create, membership_set, tenant_create

NGINX_SITE = """\
# Managed by Bellwether: {{ server_name }}
upstream shop_app {
{%- for server in upstreams %}
    server {{ server }} max_fails=3 fail_timeout=10s;
{%- endfor %}
    keepalive 32;
}

server {
    listen {{ listen }};
    server_name {{ server_name }};

    location / {
        proxy_pass http://shop_app;
        proxy_set_header Host $host;
        proxy_set_header X-Request-Id $request_id;
        proxy_read_timeout {{ proxy.read_timeout_s }}s;
    }

    location = /healthz {
        return 200 "ok\\n";
    }
}
"""

APP_CONFIG = """\
{
  "environment": {{ environment | tojson }},
  "log_level": {{ app.log_level | tojson }},
  "workers": {{ app.workers }},
  "database": {
    "host": {{ app.database.host | tojson }},
    "name": {{ app.database.name | tojson }},
    "password": {{ app.database.password | tojson }}
  },
  "features": {{ app.features | tojson }},
  {#- What an app team's descriptor released: its version and its params. #}
  {%- set released = params | default({}) %}
  "release": {
    "version": {{ (descriptor | default({})).version | default(none) | tojson }},
    "channel": {{ released.release_channel | default("stable") | tojson }},
    "feature_flags": {{ released.feature_flags | default({}) | tojson }}
  }
}
"""

FALLBACK_SITE = """\
# Bellwether safe fallback: no routes, every request gets 503.
server {
    listen 80 default_server;
    return 503 "No valid configuration\\n";
}
"""

DEMO_POLICY = {"descriptor_policy": {
    "params": ["release_channel", "feature_flags"],
    "secret_refs": ["env:SHOP_*", "vault:secret/data/{application}/*"],
    "rollback": True,
}}

SCHEMA = {
    "type": "object",
    "required": ["server_name", "listen", "upstreams", "app"],
    "properties": {
        "listen": {"type": "integer", "minimum": 1, "maximum": 65535},
        "upstreams": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "app": {
            "type": "object",
            "properties": {
                "log_level": {"enum": ["debug", "info", "warning", "error"]},
                "workers": {"type": "integer", "minimum": 1},
            },
        },
    },
}


def config_for(name: str, workers: int) -> str:
    return f"""\
environment: {name}
server_name: shop.{name}.example.com
listen: 80
upstreams:
  - 10.20.{1 if name == "staging" else 2}.11:8080
  - 10.20.{1 if name == "staging" else 2}.12:8080
proxy:
  read_timeout_s: 30
app:
  log_level: {"debug" if name == "staging" else "info"}
  workers: {workers}
  database:
    host: db.{name}.internal
    name: shop
    # A secret placeholder: the agent fills it in from its own environment.
    password: "${{secret:env:SHOP_DB_PASSWORD}}"
  features:
    new_checkout: {"true" if name == "staging" else "false"}
    recommendations: true
"""


class Command(BaseCommand):
    help = (
        "Load the demo: tenant 'Shop team', application 'shop', environments "
        "shop/staging (direct) and shop/prod (staged) with an nginx site and a JSON app "
        "config, two published snapshots each (prod's second waits for a rollout), an "
        "admin and a deployer. Safe to run repeatedly."
    )

    def _create_environment(self, application, name, admin):
        environment = environment_create(
            application=application, name=name, config=config_for(name, workers=4),
            config_schema=SCHEMA, poll_interval_s=10 if name == "staging" else 30,
            release_policy="direct" if name == "staging" else "staged", actor=admin)
        for path, text in (("nginx/sites-enabled/shop.conf", NGINX_SITE),
                           ("shop/config.json", APP_CONFIG)):
            environment_file_put(environment=environment, kind="template", path=path,
                                 text=text, actor=admin)
        environment_file_put(environment=environment, kind="fallback",
                             path="nginx/sites-enabled/shop.conf", text=FALLBACK_SITE,
                             actor=admin)
        return environment

    def _user(self, username: str, password: str, *, superuser: bool):
        """The demo user with `password`. An unchanged password is not hashed again:
        a new hash would end every session of that user."""
        users = get_user_model().objects
        user = users.filter(username=username).first()
        if user is None:
            create = users.create_superuser if superuser else users.create_user
            return create(username, f"{username}@example.com", password)
        if not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
        return user

    def _publish(self, environment, admin) -> None:
        """Publish and render now, in every mode: the demo must not wait for (or race
        in) a worker's queue. The queued render then finds the publication finished."""
        publication = snapshot_publish(environment=environment, actor=admin)
        publication_complete(publication_id=str(publication.pk))

    def handle(self, *args, **options):
        password = os.environ.get("BELLWETHER_DEMO_PASSWORD", "bellwether-demo")
        admin = self._user("admin", password, superuser=True)
        dev = self._user("dev", password, superuser=False)

        if not PlatformPolicy.objects.exists():
            policy_publish(content=DEMO_POLICY, actor=admin)
        with transaction.atomic():
            tenant = Tenant.objects.filter(slug="shop-team").first() or tenant_create(
                name="Shop team", slug="shop-team", actor=admin)
            membership_set(tenant=tenant, user=dev, role=Role.DEPLOYER, actor=admin)
            application = Application.objects.filter(name="shop").first() or application_create(
                tenant=tenant, name="shop", description="The web shop", actor=admin)

        for name in ("staging", "prod"):
            environment = Environment.objects.filter(application=application, name=name).first()
            if environment is None:
                with transaction.atomic():  # all of its files, or nothing
                    environment = self._create_environment(application, name, admin)
            if environment.snapshot_counter == 0:
                self._publish(environment, admin)
                # A second release, so the admin has a diff to show.
                environment_update(environment=environment, actor=admin,
                                   config=config_for(name, workers=8))
                self._publish(environment, admin)
                environment.refresh_from_db()
                if environment.is_staged and environment.active_snapshot is None:
                    # prod is staged: #1 released by an explicit activation, #2 waits
                    # for a rollout.
                    snapshot_activate(snapshot=environment.snapshots.get(number=1),
                                      actor=admin)
            environment.refresh_from_db()
            self.stdout.write(f"Environment {environment.full_name}: "
                              f"{environment.snapshot_counter} snapshot(s)")

        base = f"http://127.0.0.1:{os.environ.get('PORT', '8000')}"
        self.stdout.write(self.style.SUCCESS(
            f"\nDemo ready. Dashboard: {base}/   Admin: {base}/admin/\n"
            f"  admin / {password}   (superuser, environment owner)\n"
            f"  dev   / {password}   (deployer in 'Shop team'; API token: "
            "manage.py api_token create dev)\n"
            f"API docs: {base}/api/docs/"))
