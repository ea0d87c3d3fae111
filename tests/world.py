"""shop/prod's chain, kept between tests: superuser -> tenant -> application ->
environment -> first, then snapshot #2 on it one of two ways: `second_active`
(4 workers become 8, active) or `second_staged` (the release policy staged first,
so #2 is ready and not active) — tests/conftest.py's fixtures of those names.

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
from apps.releases import services as releases
from apps.snapshots.models import Snapshot
from apps.tenancy.models import Application, Tenant
from tests import factories

CHAIN = ("superuser", "tenant", "application", "environment", "first")
SECONDS = ("second_active", "second_staged")  # the ways the chain goes on from `first`
_MODELS = {"superuser": get_user_model(), "tenant": Tenant, "application": Application,
           "environment": Environment, "first": Snapshot, "second_active": Snapshot,
           "second_staged": Snapshot}


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
    if name == "first":
        return factories.publish(kept["environment"], actor)
    return build_second(kept["environment"], actor, staged=name == "second_staged")


def build_second(environment, actor, *, staged: bool):
    """Snapshot #2 of shop/prod on #1: 4 workers become 8; with `staged`, the release
    policy made staged first, so it is ready and not active."""
    if staged:
        environment = releases.environment_update(environment=environment,
                                                  release_policy="staged", actor=actor)
    return factories.publish_variant(environment, actor, workers=8)


class KeptChain:
    """The levels built, as (name, open atomic block, primary key), in chain order."""

    def __init__(self):
        self.levels: list[tuple[str, transaction.Atomic, int]] = []
        # Each level's object as read back since the chain last changed (building a
        # level changes the rows below it: `first` activates itself on the environment).
        self.read: dict[str, object] = {}

    @staticmethod
    def wanted(item) -> tuple[str, ...]:
        """The levels a test asks for, directly or through fixtures: the chain up to
        the deepest it names, and a second snapshot's way when it names one."""
        names = item.fixturenames
        second = next((name for name in SECONDS if name in names), None)
        if second is not None:
            return (*CHAIN, second)
        return CHAIN[:max((i + 1 for i, name in enumerate(CHAIN) if name in names), default=0)]

    def prepare(self, wanted: tuple[str, ...]) -> None:
        """Cut the chain back to the levels it shares with `wanted`, then build it up to
        them; none inside a transaction that is not the chain's (a module's own,
        module_transaction)."""
        if not self.levels and transaction.get_connection().in_atomic_block:
            wanted = ()
        shared = 0
        while shared < min(len(wanted), len(self.levels)) and (
                self.levels[shared][0] == wanted[shared]):
            shared += 1
        if len(self.levels) > shared:
            self.read.clear()
        while len(self.levels) > shared:
            _, atomic, _ = self.levels.pop()
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)
        for name in wanted[len(self.levels):]:
            kept = {level: self.kept(level) for level, _, _ in self.levels}
            atomic = transaction.atomic()
            atomic.__enter__()
            try:
                pk = _build(name, kept).pk
            except BaseException:
                transaction.set_rollback(True)
                atomic.__exit__(None, None, None)
                raise
            self.levels.append((name, atomic, pk))
            self.read.clear()

    def pk_of(self, name: str) -> int | None:
        """The level's primary key, or None when it is not kept."""
        return next((pk for level, _, pk in self.levels if level == name), None)

    def kept(self, name: str):
        """A copy of the level's object as stored, or None when it is not kept: every
        test changes rows only inside its own savepoint, so the row read back once
        serves each test until the chain changes, and a test changes only its copy."""
        pk = self.pk_of(name)
        if pk is None:
            return None
        if name not in self.read:
            self.read[name] = _MODELS[name].objects.get(pk=pk)
        return copy.deepcopy(self.read[name])
