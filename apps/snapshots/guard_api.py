"""The degenerate-render guard on the API: the `confirm` flag and the 409 answer."""

from rest_framework import serializers

from apps.core.api import error_response
from apps.snapshots.models import Publication
from apps.snapshots.rules import confirmation_details, degenerate_summary


class ConfirmSerializer(serializers.Serializer):
    confirm = serializers.BooleanField(
        default=False, help_text="Accept a degenerate render up front (a file that had "
                                 "content emptied, or the files shrinking by the "
                                 "environment's shrink_threshold_percent or more); without "
                                 "it such a snapshot is stored and held: 409 "
                                 "confirmation_required.")


class RollbackSerializer(serializers.Serializer):
    confirm = serializers.BooleanField(
        default=False, help_text="Roll back even to content that is a degenerate render "
                                 "against the active snapshot: 409 confirmation_required "
                                 "without it (nothing is queued).")


def confirmation_response(publication: Publication, body: dict):
    """409 confirmation_required naming the emptied files and the shrink; the held
    snapshot is stored, and POST /api/v1/publications/<id>/confirm releases it."""
    findings = publication.needs_confirmation
    response = error_response(
        409, "confirmation_required",
        f"#{publication.snapshot.number} is stored and held, not released: against the "
        f"active #{findings['against']}, {degenerate_summary(findings)}. Confirm it "
        f"(POST {body['url']}/confirm) or publish with confirm: true.",
        confirmation_details(findings))
    response.data["error"]["publication"] = body
    return response
