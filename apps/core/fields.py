"""Serializer fields for names and labels: text that people read and that lands in
file names, logs and selectors, so no control or formatting characters
(apps.core.text.name_problem)."""

from rest_framework import serializers

from apps.core.text import name_problem


def validate_name(value: str) -> None:
    problem = name_problem(value)
    if problem:
        raise serializers.ValidationError(problem)


class NameField(serializers.CharField):
    def __init__(self, **kwargs):
        kwargs["validators"] = [*kwargs.get("validators", []), validate_name]
        super().__init__(**kwargs)


class LabelsField(serializers.DictField):
    """{label: value}; keys and values are names (values may be empty)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("child", NameField(allow_blank=True))
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        errors = {key: [name_problem(key)] for key in value if name_problem(key)}
        if errors:
            raise serializers.ValidationError(
                {key.encode("unicode_escape").decode(): messages
                 for key, messages in errors.items()})
        return value
