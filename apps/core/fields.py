"""Serializer fields for names and labels: text that people read and that lands in
file names, logs and selectors, so no control or formatting characters
(apps.core.text.name_problem)."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.text import name_problem, neutralised, whole_number

BIGINT_MAX = 2**63 - 1


def validate_name(value: str) -> None:
    problem = name_problem(value)
    if problem:
        raise serializers.ValidationError(problem)


class ShownTextField(serializers.CharField):
    """Free text an agent reports, stored neutralised (apps.core.text.neutralised):
    control and bidirectional characters become U+FFFD, LF and tab stay."""

    def to_internal_value(self, data):
        return neutralised(super().to_internal_value(data))


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


class WholeNumberField(serializers.IntegerField):
    """An integer of a body: a JSON or YAML integer (never a boolean or a float such as
    1.0), or text of plain ASCII digits (no sign, space, point, or a digit such as "٣")
    — apps.core.text.whole_number, the dashboard's rule too. Unbounded fields are held
    to a 64-bit integer."""

    default_error_messages = {"invalid": "A whole number is required (digits 0-9)."}

    def __init__(self, **kwargs):
        kwargs.setdefault("max_value", BIGINT_MAX)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, int):
            return data
        if isinstance(data, str) and data.isascii() and data.isdigit():
            number = whole_number(data, maximum=BIGINT_MAX)
            if number is None:
                self.fail("max_value", max_value=self.max_value)
            return number
        self.fail("invalid")


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}],
                     "description": "An agent's id or its name."})
class AgentReferenceField(serializers.Field):
    """An agent by its id (a whole number) or its name (text, a name): which agent
    of the environment a name is is looked up where the environment is known
    (apps.fleet.selectors.agent_ids_named)."""

    default_error_messages = {"invalid": "Expected an agent's id or name."}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.id = WholeNumberField(min_value=1, max_value=2**63 - 1)
        self.name = NameField()

    def to_internal_value(self, data):
        if isinstance(data, str) and not data.isdigit():
            return self.name.run_validation(data)
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("invalid")
        return self.id.run_validation(data)

    def to_representation(self, value):
        return value
