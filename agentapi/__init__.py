"""The agents' HTTP transport, above the domain: the poll, answered here alone (edge:
from the cache; desired: from the database; longpoll), bundles (bundle_edge) and
reports (report_edge), answered on the event loop in front of Django. The domain never imports it
(.importlinter): a change announces which agents it concerns
(apps.fleet.announcements) and the long-polls here listen."""
