"""The agents' HTTP transport, above the domain, in front of Django: the poll (cached:
from the cache; desired: from the database; longpoll), bundles (bundle) and reports
(reports: in batches), each answered here alone, every check of an answer from the
database in checks. The domain never imports it
(.importlinter): a change announces which agents it concerns
(apps.fleet.announcements) and the long-polls here listen."""
