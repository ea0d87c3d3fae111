"""Django validators and form fields carrying the API's text and number rules, so the
admin's forms (model fields) check exactly what the API's serializers check."""

from django import forms
from django.core.exceptions import ValidationError

from apps.core.text import name_problem, whole_number


def validate_name_text(value: str) -> None:
    """A name, label or path (apps.core.text.name_problem)."""
    problem = name_problem(value)
    if problem:
        raise ValidationError(problem, code="invalid")


class WholeNumberFormField(forms.IntegerField):
    """A form's whole number in plain ASCII digits (apps.core.text.whole_number): no
    "1.0", "٣", sign or space."""

    def to_python(self, value):
        if value in self.empty_values:
            return None
        number = whole_number(str(value), maximum=2**63 - 1)
        if number is None:
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return number
