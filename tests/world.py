"""shop/prod's chain, kept between tests: superuser -> tenant -> application ->
environment -> first (tests/conftest.py's fixtures of those names).

Most tests stand on some prefix of this chain, and building all of it takes about
ninety queries through the real services, more than many tests take themselves. So
the chain is built once, a level per open transaction (a savepoint below the
first), and kept for the tests after it: each test runs in pytest-django's savepoint
inside it and is rolled back to it, and the fixtures get copies of their objects as
read back once the chain last changed. Before each database test the chain is cut
back to exactly the levels the test asks for, and built up to them: a test sees the
rows it would see if its world were built for it alone, and a test that asks for
none of it sees none.

Tests that need transactions of their own (transaction=True, transactional_db) and
modules with a transaction of their own around their tests (module_transaction) get
no kept chain; their fixtures build what they ask for, as before.
"""

from __future__ import annotations

import copy

from django.contrib.auth import get_user_model
from django.db import transaction

from apps.environments.models import Environment
from apps.snapshots.models import Snapshot
from apps.tenancy.models import Application, Tenant
from tests import factories

CHAIN = ("superuser", "tenant", "application", "environment", "first")
_MODELS = {"superuser": get_user_model(), "tenant": Tenant, "application": Application,
           "environment": Environment, "first": Snapshot}


def _build(name: str, kept: dict):
    """The row of level `name`, on the levels below it (`kept`: name -> object)."""
    if name == "superuser":
        return factories.superuser()
    actor = kept["superuser"]
    if name == "tenant":
        return factories.tenant(actor=actor)
    if name == "application":
        return factories.application(kept["tenant"], actor=actor)
    if name == "environment":
        return factories.environment(kept["application"], "prod",
                                     templates=factories.SHOP_TEMPLATES, actor=actor)
    return factories.publish(kept["environment"], actor)


class KeptChain:
    """The levels built, as (open atomic block, primary key), in CHAIN order."""

    def __init__(self):
        self.levels: list[tuple[transaction.Atomic, int]] = []
        # Each level's object as read back since the chain last changed (building a
        # level changes the rows below it: `first` activates itself on the environment).
        self.read: dict[str, object] = {}

    @staticmethod
    def depth_wanted(item) -> int:
        names = item.fixturenames
        return max((index + 1 for index, name in enumerate(CHAIN) if name in names), default=0)

    def prepare(self, depth: int) -> None:
        """Cut the chain back to `depth` levels, then build it up to them; none inside a
        transaction that is not the chain's (a module's own, module_transaction)."""
        if not self.levels and transaction.get_connection().in_atomic_block:
            depth = 0
        while len(self.levels) > depth:
            self.read.clear()
            atomic, _ = self.levels.pop()
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)
        while len(self.levels) < depth:
            kept = {name: self.kept(name) for name in CHAIN[:len(self.levels)]}
            atomic = transaction.atomic()
            atomic.__enter__()
            try:
                pk = _build(CHAIN[len(self.levels)], kept).pk
            except BaseException:
                transaction.set_rollback(True)
                atomic.__exit__(None, None, None)
                raise
            self.levels.append((atomic, pk))
            self.read.clear()

    def kept(self, name: str):
        """A copy of the level's object as stored, or None when it is not kept: every
        test changes rows only inside its own savepoint, so the row read back once
        serves each test until the chain changes, and a test changes only its copy."""
        index = CHAIN.index(name)
        if index >= len(self.levels):
            return None
        if name not in self.read:
            self.read[name] = _MODELS[name].objects.get(pk=self.levels[index][1])
        return copy.deepcopy(self.read[name])
