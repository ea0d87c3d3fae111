"""Audit actions are constants; what counts as a change of render inputs is a
property of the action, not a list kept in step by hand."""

import pytest
from django.db import transaction

from apps.audit.models import RENDER_INPUTS, Action
from apps.audit.services import audit_record
from apps.core import locks


@pytest.mark.parametrize("action", sorted(RENDER_INPUTS))
def test_changes_to_what_snapshots_render_from_are_render_inputs(action):
    assert Action(action).changes_render_inputs


@pytest.mark.parametrize("action", [
    Action.ENVIRONMENT_SETTINGS, Action.ENVIRONMENT_OWNERS, Action.AGENT_UPDATE,
    Action.SNAPSHOT_ACTIVATE, Action.PUBLICATION_CREATE, Action.ROLLOUT_CREATE,
    Action.POLICY_PUBLISH])
def test_settings_owners_agents_and_releases_are_not_render_inputs(action):
    assert not action.changes_render_inputs


def test_a_file_change_names_its_kind_and_change():
    assert Action.file_change("template", "delete") is Action.TEMPLATE_DELETE
    assert Action.file_change("fallback", "create") is Action.FALLBACK_CREATE


def test_an_unknown_action_is_refused_before_anything_is_written(tenant, db):
    with pytest.raises(ValueError):
        audit_record(actor=None, action="environment.explode", obj=tenant)


def test_locks_are_refused_outside_a_transaction(tenant, transactional_db):
    with pytest.raises(RuntimeError, match="inside transaction.atomic"):
        locks.lock_one(type(tenant).objects, pk=tenant.pk)
    with transaction.atomic():
        assert locks.lock_one(type(tenant).objects, pk=tenant.pk) == tenant
