"""The dashboard's governance forms: deciding on a release (naming the content
reviewed) and an owner's emergency override of the freezes."""

from django import forms

from apps.core.validators import WholeNumberFormField
from apps.dashboard.forms import DashboardForm


class DecisionForm(DashboardForm):
    """Approve or reject a release, naming the content reviewed (hidden fields)."""

    checksum = forms.CharField(max_length=71, widget=forms.HiddenInput)
    plan_digest = forms.CharField(max_length=64, widget=forms.HiddenInput)
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea)


class OverrideForm(DashboardForm):
    """An owner's emergency override of the freezes: a reason and how long."""

    reason = forms.CharField(max_length=500)
    minutes = WholeNumberFormField(min_value=1, max_value=24 * 60, initial=60)
