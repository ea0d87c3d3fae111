"""The agents' HTTP transport, above the domain: the poll (edge: from the cache;
desired: from the database; longpoll) and bundles (bundle), answered here alone,
every check from the database in checks; reports (report_edge) recorded in batches
on the event loop in front of Django. The domain never imports it
(.importlinter): a change announces which agents it concerns
(apps.fleet.announcements) and the long-polls here listen."""
