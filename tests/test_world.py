"""The kept chain (tests/world.py): cut back to exactly the levels a test asks for,
built up again on the levels kept, and gone entirely for a test that asks for none."""

from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from apps.environments.models import Environment
from apps.snapshots.models import Snapshot
from apps.tenancy.models import Tenant
from tests.world import CHAIN, KeptChain


def test_a_test_asks_for_the_deepest_level_it_names_directly_or_through_fixtures():
    def wanted(*names):
        return KeptChain.wanted(SimpleNamespace(fixturenames=["db", *names]))

    assert (wanted(), wanted("superuser"), wanted("tenant", "superuser")) == (
        (), CHAIN[:1], CHAIN[:2])
    assert wanted("first", "environment", "application", "tenant", "superuser") == CHAIN
    assert wanted("second_staged", "first", "superuser") == (*CHAIN, "second_staged")


# Its own transactions: no chain is kept around this test, so the one it makes is alone.
@pytest.mark.django_db(transaction=True)
def test_the_chain_is_cut_back_to_what_is_asked_for_and_built_up_on_what_stays():
    chain = KeptChain()
    try:
        chain.prepare(CHAIN)
        environment = chain.kept("environment")
        assert chain.kept("first").number == 1
        assert environment.active_snapshot_id == chain.kept("first").pk

        # Each test gets a copy of its own: what one changes in memory, the next
        # does not see.
        environment.name = "changed"
        chain.kept("tenant").restrictions["changed"] = "yes"
        assert chain.kept("environment").name == "prod"
        assert "changed" not in chain.kept("tenant").restrictions

        chain.prepare(CHAIN[:4])
        assert chain.kept("first") is None and not Snapshot.objects.exists()
        assert Environment.objects.get().pk == environment.pk  # the levels below stay
        # and are read back as they are now: #1 no longer active
        assert chain.kept("environment").active_snapshot_id is None
        assert Environment.objects.get().active_snapshot_id is None

        chain.prepare(CHAIN)
        assert Snapshot.objects.get().number == 1

        # A second snapshot one way, then the other: #2 is built again on #1.
        chain.prepare((*CHAIN, "second_active"))
        active = chain.kept("second_active")
        assert chain.kept("environment").active_snapshot_id == active.pk
        chain.prepare((*CHAIN, "second_staged"))
        assert chain.kept("second_active") is None
        staged, environment = chain.kept("second_staged"), chain.kept("environment")
        assert (staged.number, environment.release_policy) == (2, "staged")
        assert environment.active_snapshot_id == chain.kept("first").pk
        assert list(Snapshot.objects.values_list("number", flat=True).order_by("number")) == [1, 2]

        chain.prepare(())
        assert not Tenant.objects.exists() and not get_user_model().objects.exists()
    finally:
        chain.prepare(())


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_not_its_own_the_chain_keeps_nothing():
    chain = KeptChain()
    with transaction.atomic():  # as module_transaction holds one around its module
        chain.prepare(CHAIN)
        assert chain.levels == [] and chain.kept("superuser") is None
        assert not get_user_model().objects.exists()
