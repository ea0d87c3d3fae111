"""Serializers of the snapshot API's answers that need no other app: rendered
files and problems, a preview, a diff, and a publication's hold."""

from rest_framework import serializers

from apps.core.fields import WholeNumberField


class FileSerializer(serializers.Serializer):
    path = serializers.CharField()
    content = serializers.CharField()


class ProblemSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    file = serializers.CharField(required=False)
    line = WholeNumberField(required=False)
    key = serializers.CharField(required=False)


class PreviewSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    errors = ProblemSerializer(many=True)
    checksum = serializers.CharField(allow_null=True)
    effective_config = serializers.JSONField()
    provenance = serializers.DictField(child=serializers.CharField())
    files = FileSerializer(many=True)
    fallback_files = FileSerializer(many=True)


class FileDiffSerializer(serializers.Serializer):
    path = serializers.CharField()
    status = serializers.ChoiceField(["added", "removed", "modified"])
    diff = serializers.CharField(allow_blank=True, help_text=(
        "Unified diff; empty when too_large."))
    too_large = serializers.BooleanField(help_text=(
        "Too costly to match line by line: shown as changed, with sizes and checksums."))
    old_bytes = serializers.IntegerField(required=False, allow_null=True)
    new_bytes = serializers.IntegerField(required=False, allow_null=True)
    old_checksum = serializers.CharField(required=False, allow_null=True)
    new_checksum = serializers.CharField(required=False, allow_null=True)


class SnapshotDiffSerializer(serializers.Serializer):
    snapshot = WholeNumberField()
    against = WholeNumberField(allow_null=True)
    files = FileDiffSerializer(many=True)


class HeldSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="The release gate's refusal: approval_required, "
                                           "frozen, ...")
    message = serializers.CharField()
    details = serializers.JSONField(help_text="For approval_required after a direct "
                                              "publish: {release, url, snapshot, required, "
                                              "given, missing, ...}, the release submitted "
                                              "to ask for approval of activating it.")
