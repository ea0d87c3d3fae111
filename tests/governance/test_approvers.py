"""Who may approve, and what an approval names — hostile findings and their variants:

- an author of the content never approves it: who asked, who published the
  snapshot, and who edited the release's snapshot or plan since (an owner who
  edits a release and approves it would be a second pair of eyes that is not);
- approvers are the environment's owners or members of the groups the rule names,
  and members of the environment's tenant (a Django group spans tenants);
- a release asked for before the environment was governed gets no free pass;
- every surface names the content approved: the admin's bulk action first shows
  each release's checksum and plan digest and approves exactly those, refusing a
  release changed since it was shown."""

import pytest
from django.contrib.auth.models import Group

from apps.core.errors import Conflict, PermissionDenied
from apps.governance import rules, services
from apps.governance.models import Approval
from apps.governance.selectors import approval_missing
from apps.releases import services as releases
from tests import factories
from tests.governance.conftest import approve

pytestmark = pytest.mark.django_db

ADMIN = "/admin/governance/releaserequest/"


def _not_an_approver(call) -> PermissionDenied:
    with pytest.raises(PermissionDenied) as raised:
        call()
    assert raised.value.code == "not_an_approver"
    return raised.value


def test_an_owner_who_edited_a_release_never_approves_it(activation, alice, bob, member,
                                                         second, deployer):
    carol = member("owner", username="carol")
    services.release_update(release=activation, actor=alice, expected_version=1,
                            plan=rules.push_plan(None))

    refusal = _not_an_approver(lambda: approve(activation, alice))
    assert "author" in refusal.message
    approve(activation, bob)
    approve(activation, carol)
    activation.refresh_from_db()
    assert sorted(a.approver.username for a in activation.approvals.filter(
        cancelled_at__isnull=True)) == ["bob", "carol"]


def test_an_approval_given_before_editing_stops_counting(activation, alice, bob, deployer,
                                                         second):
    """Alice approves, then edits (her approval is cancelled with every other), then
    may not approve her own edit: the release waits for two others."""
    approve(activation, alice)
    services.release_update(release=activation, actor=alice, expected_version=1,
                            plan=rules.push_plan(None))
    approve(activation, bob)
    activation.refresh_from_db()
    missing = approval_missing(activation)
    assert (missing["given"], missing["missing"], missing["approved_by"]) == (1, 1, ["bob"])


def test_a_deployer_never_approves_on_any_surface(activation, member):
    editor = member("deployer", username="eddie")
    services.release_update(release=activation, actor=editor, expected_version=1,
                            plan=rules.push_plan(None))
    activation.refresh_from_db()
    body = {"checksum": activation.checksum, "plan_digest": activation.plan_digest}

    api = factories.api_client_for(editor).post(f"/api/v1/releases/{activation.pk}/approve",
                                                body, format="json")
    page = factories.session_client(editor).post(
        f"/e/shop/prod/governance/releases/{activation.pk}/approve/", body,
        HTTP_HX_REQUEST="true")

    assert api.status_code == 403 and api.json()["error"]["code"] == "not_an_approver"
    assert page.status_code == 403
    assert not Approval.objects.exists()


def test_a_group_approver_must_belong_to_the_environments_tenant(activation, outsider,
                                                                 member, superuser,
                                                                 environment):
    cab = Group.objects.create(name="cab")
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=1,
                               owners_approve=False, approver_groups=["cab"], strict=True)
    viewer = member("viewer", username="val")
    for user in (outsider, viewer):
        user.groups.add(cab)

    refusal = _not_an_approver(lambda: approve(activation, outsider))
    assert "tenant" in refusal.message
    approve(activation, viewer)  # a member of the group and of the tenant


def test_an_owner_outside_the_rules_groups_may_not_approve(activation, alice, superuser,
                                                           environment):
    Group.objects.create(name="cab")
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=1,
                               owners_approve=False, approver_groups=["cab"], strict=True)
    assert "members of cab" in _not_an_approver(lambda: approve(activation, alice)).message


def test_a_release_asked_for_before_governance_needs_the_approvals_of_now(
        second, environment, deployer, superuser, alice, bob):
    """Hostile finding: submitted while the environment needed no approval, the
    release kept a rule of 0 approvals and went out unapproved once governed."""
    early = services.release_submit(environment=environment, snapshot=second,
                                    plan=rules.activation_plan(), actor=deployer)
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=2)

    with pytest.raises(Conflict) as raised:
        releases.snapshot_activate(snapshot=second, actor=deployer)
    assert (raised.value.code, raised.value.details["given"],
            raised.value.details["required"]) == ("approval_required", 0, 2)
    approve(early, alice)
    approve(early, bob)
    releases.snapshot_activate(snapshot=second, actor=deployer)


# --- the admin's bulk action names the content it showed -------------------------------


def _staff(user):
    user.is_staff = True
    user.save()
    return factories.session_client(user)


def _shown(client, *releases):
    """The action's first step: a page showing each release's content, approving none."""
    page = client.post(ADMIN, {"action": "approve",
                               "_selected_action": [r.pk for r in releases]})
    assert page.status_code == 200
    html = page.content.decode()
    for release in releases:
        assert release.checksum in html and release.plan_digest in html
    assert not Approval.objects.exists()
    return html


def _approve_shown(client, *releases):
    form = {"action": "approve", "reviewed": "yes",
            "_selected_action": [r.pk for r in releases]}
    for release in releases:
        form[f"release-{release.pk}-checksum"] = release.checksum
        form[f"release-{release.pk}-plan_digest"] = release.plan_digest
    return client.post(ADMIN, form, follow=True)


def test_the_admin_refuses_a_release_changed_after_it_was_shown(activation, alice, deployer):
    client = _staff(alice)
    _shown(client, activation)
    shown = type("Shown", (), {"pk": activation.pk, "checksum": activation.checksum,
                               "plan_digest": activation.plan_digest})
    services.release_update(release=activation, actor=deployer, expected_version=1,
                            plan=rules.push_plan(None))  # changed behind the page

    response = _approve_shown(client, shown)

    assert "no longer holds the content you reviewed" in response.content.decode()
    assert not Approval.objects.exists()


def test_the_admin_approves_nothing_it_did_not_show(activation, alice):
    response = _staff(alice).post(ADMIN, {"action": "approve", "reviewed": "yes",
                                          "_selected_action": [activation.pk]}, follow=True)
    assert "approve it from the page that shows its content" in response.content.decode()
    assert not Approval.objects.exists()


def test_the_admin_never_lets_an_editor_approve(activation, alice):
    services.release_update(release=activation, actor=alice, expected_version=1,
                            plan=rules.push_plan(None))
    activation.refresh_from_db()
    response = _approve_shown(_staff(alice), activation)
    assert "the author of a change cannot approve" in response.content.decode()
    assert not Approval.objects.exists()
