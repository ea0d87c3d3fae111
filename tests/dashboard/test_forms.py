"""The dashboard's forms on their own: what each one accepts, what it refuses and with
which message, and that no number can make them fail with anything but a form error.
(tests/dashboard/test_views.py has them through the pages.)"""

import sys

import pytest
import yaml
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import QueryDict

from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.dashboard.forms import (
    AGENT_ID_MAX,
    NUMBER_MAX,
    DeployForm,
    DescriptorForm,
    DiffForm,
    NumberField,
    RolloutActionForm,
    RolloutForm,
)

# More digits than int() converts (ValueError beyond sys.get_int_max_str_digits()).
TOO_MANY_DIGITS = "9" * (sys.get_int_max_str_digits() + 1)


def query(**fields) -> QueryDict:
    """Form data as a request has it (several values under one name: a list)."""
    data = QueryDict(mutable=True)
    for name, value in fields.items():
        data.setlist(name, value if isinstance(value, list) else [value])
    return data


@pytest.mark.parametrize(("text", "number"), [
    ("1", 1), ("42", 42), ("007", 7), (str(NUMBER_MAX), NUMBER_MAX),
    ("0" * 30 + "5", 5),  # leading zeros do not count towards the bound
])
def test_a_number_field_takes_ascii_digits_within_bounds(text, number):
    assert NumberField("bad.").clean(text) == number


@pytest.mark.parametrize("text", [
    "", "0", "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x1", "1_000", "abc",
    "\u00b2",  # superscript two: isdigit() but not int()
    "\u0663",  # Arabic-Indic three: int() takes it
    "\uff13",  # fullwidth three: int() takes it too
    str(NUMBER_MAX + 1), "9" * 20, TOO_MANY_DIGITS,
])
def test_a_number_field_refuses_anything_else_with_its_one_message(text):
    field = NumberField("pick a number.")

    with pytest.raises(ValidationError) as refused:
        field.clean(text)

    assert refused.value.messages == ["pick a number."]


def test_a_number_fields_bound_is_its_maximum():
    field = NumberField("bad.", maximum=AGENT_ID_MAX)

    assert field.clean(str(AGENT_ID_MAX)) == AGENT_ID_MAX
    assert not DeployForm(query(agent=str(AGENT_ID_MAX + 1))).is_valid()


# --- deploy now ------------------------------------------------------------------


class Active:
    number = 4


def test_deploy_to_all_defaults_to_the_active_snapshot():
    form = DeployForm(query(agent="all"), active=Active())

    assert form.is_valid(), form.errors
    assert (form.cleaned_data["snapshot"], form.cleaned_data["agent"]) == (4, None)


def test_deploy_takes_the_snapshot_its_button_names_and_one_agent():
    form = DeployForm(query(snapshot="3", agent="17"), active=Active())

    assert form.is_valid(), form.errors
    assert (form.cleaned_data["snapshot"], form.cleaned_data["agent"]) == (3, 17)


@pytest.mark.parametrize(("data", "active", "lines"), [
    ({"agent": "all"}, None, ["snapshot: nothing to deploy yet: publish a snapshot first."]),
    ({"snapshot": "", "agent": "3"}, None,
     ["snapshot: nothing to deploy yet: publish a snapshot first."]),
    ({"snapshot": "x", "agent": "all"}, Active(), ["snapshot: not a snapshot number."]),
    # Every agent is asked for by name: left out or empty is a mistake, not "all".
    ({}, Active(), ["agent: choose an agent, or all agents."]),
    ({"agent": ""}, Active(), ["agent: choose an agent, or all agents."]),
    ({"agent": "ALL"}, Active(), ["agent: not an agent id."]),
    ({"agent": " all"}, Active(), ["agent: not an agent id."]),
    ({"agent": "web-1"}, Active(), ["agent: not an agent id."]),
    ({"snapshot": "0", "agent": "-3"}, Active(),
     ["snapshot: not a snapshot number.", "agent: not an agent id."]),
])
def test_deploy_refusals_are_lines_naming_their_field(data, active, lines):
    form = DeployForm(query(**data), active=active)

    assert not form.is_valid()
    assert form.error_lines() == lines


# --- confirm / roll back a rollout ---------------------------------------------------


def test_a_rollout_action_takes_the_version_the_page_showed():
    form = RolloutActionForm(query(expected_version="12"))

    assert form.is_valid() and form.cleaned_data["expected_version"] == 12


@pytest.mark.parametrize("data", [{}, {"expected_version": ""}, {"expected_version": "v12"},
                                  {"expected_version": TOO_MANY_DIGITS}])
def test_a_rollout_action_without_a_version_is_refused(data):
    form = RolloutActionForm(query(**data))

    assert not form.is_valid()
    assert form.error_lines() == ["expected_version: reload the page and try again."]


# --- the diff viewer ---------------------------------------------------------------


class Snap:
    def __init__(self, number, state="ready", pk=None):
        self.number, self.state, self.label, self.pk = number, state, f"label-{number}", pk


def test_diff_without_to_compares_nothing_yet():
    form = DiffForm(query())

    assert form.is_valid()
    assert (form.cleaned_data["to"], form.cleaned_data["from"]) == (None, None)


def test_diff_offers_the_ready_snapshots_and_keeps_the_choice():
    form = DiffForm(query(to="3", **{"from": "1"}),
                    snapshots=[Snap(3), Snap(2, "invalid"), Snap(1)])

    assert form.is_valid()
    assert (form.cleaned_data["to"], form.cleaned_data["from"]) == (3, 1)
    html = str(form["to"]) + str(form["from"])
    assert '<option value="3" selected>#3 label-3</option>' in html
    assert '<option value="1" selected>#1 label-1</option>' in html
    assert "#2" not in html
    assert '<option value="">the previous ready one</option>' in html


def test_diff_with_a_junk_number_names_the_field():
    form = DiffForm(query(to="2", **{"from": "\u00b2"}))

    assert not form.is_valid()
    assert form.errors == {"from": ["pick a snapshot number."]}


def test_a_refusal_about_a_field_is_attached_to_it_else_left_to_the_page():
    form = DiffForm(query(to="9"))
    assert form.is_valid()

    assert form.add_refusal(NotFound("Snapshot 9 of shop/prod not found."), "to")
    assert not form.add_refusal(Conflict("Snapshot 9 is invalid."))
    assert form.errors == {"to": ["Snapshot 9 of shop/prod not found."]}


# --- rollouts ----------------------------------------------------------------------


class Agent:
    def __init__(self, pk, name):
        self.pk, self.name = pk, name


ROLLOUT_CHOICES = {"snapshots": [Snap(3, pk=30), Snap(2, pk=20)],
                   "agents": [Agent(5, "web-1"), Agent(6, "web-2")]}


def test_a_rollout_plan_is_one_wave_per_percentage_behind_the_gate():
    form = RolloutForm(query(snapshot="3", canary=["5", "6"], waves="25%, 50 ,100",
                             gate="auto"), **ROLLOUT_CHOICES)

    assert form.is_valid(), form.errors
    assert (form.cleaned_data["snapshot"], form.cleaned_data["canary"]) == (3, [5, 6])
    assert form.cleaned_data["plan"] == [{"percent": p, "gate": "auto", "bake_s": 0}
                                         for p in (25, 50, 100)]


def test_a_rollout_post_without_waves_or_gate_gets_one_manual_wave():
    form = RolloutForm(query(snapshot="3", canary="5"), **ROLLOUT_CHOICES)

    assert form.is_valid(), form.errors
    assert form.cleaned_data["plan"] == [{"percent": 100, "gate": "manual", "bake_s": 0}]


def test_an_unbound_rollout_form_offers_the_choices():
    html = str(RolloutForm(**ROLLOUT_CHOICES).as_div())

    # Offered newest first, the newest chosen (the view offers only what may roll out).
    assert '<option value="3" selected>#3 label-3</option>' in html
    assert '<option value="2">#2 label-2</option>' in html
    assert 'name="canary" value="5"' in html and "web-2" in html
    assert 'value="50, 100"' in html
    assert '<option value="manual" selected>' in html


@pytest.mark.parametrize(("data", "errors"), [
    ({"snapshot": "3"}, {"canary": ["Name the canaries: pick at least one agent."]}),
    ({"snapshot": "3", "canary": ["5", ""]}, {"canary": ["not an agent id."]}),
    ({"snapshot": "3", "canary": ["5", str(AGENT_ID_MAX + 1)]}, {"canary": ["not an agent id."]}),
    ({"canary": "5"}, {"snapshot": ["pick a snapshot to roll out."]}),
    ({"snapshot": "3", "canary": "5", "waves": ""},
     {"waves": ["percentages from 1 to 100, separated by commas."]}),
    ({"snapshot": "3", "canary": "5", "waves": "50, 101"},
     {"waves": ["percentages from 1 to 100, separated by commas."]}),
    ({"snapshot": "3", "canary": "5", "gate": "yolo"}, {"gate": ["one of manual, auto."]}),
    ({"snapshot": "x", "canary": "y", "waves": "z", "gate": ""},
     {"snapshot": ["pick a snapshot to roll out."], "canary": ["not an agent id."],
      "waves": ["percentages from 1 to 100, separated by commas."],
      "gate": ["one of manual, auto."]}),
])
def test_rollout_form_errors_are_per_field(data, errors):
    form = RolloutForm(query(**data), **ROLLOUT_CHOICES)

    assert not form.is_valid()
    assert form.errors == errors


@pytest.mark.parametrize(("error", "field"), [
    (NotFound("Snapshot 99 of shop/prod not found."), "snapshot"),
    (Conflict("#3 was rolled back.", code="quarantined"), "snapshot"),
    (ValidationFailed("The canary wave would be empty.", code="no_canaries"), "canary"),
    (ValidationFailed("Canaries [7] are not among the targets.", code="canary_not_target"),
     "canary"),
    (Conflict("shop/prod already has an active rollout.", code="rollout_active"), None),
])
def test_rollout_refusals_go_to_the_field_they_are_about(error, field):
    form = RolloutForm(query(snapshot="3", canary="5"), **ROLLOUT_CHOICES)
    assert form.is_valid()

    attached = form.add_refusal(error)

    assert attached == (field is not None)
    assert form.errors == ({field: [error.message]} if field else {})


# --- descriptors -----------------------------------------------------------------

DESCRIPTOR = {"apiVersion": "bellwether/v1", "application": "shop", "environment": "prod",
              "id": "rel-1", "version": "1"}


def test_a_pasted_descriptor_is_parsed():
    text = yaml.safe_dump(DESCRIPTOR)
    form = DescriptorForm(query(descriptor=text, step="publish"))

    assert form.is_valid(), form.errors
    assert form.cleaned_data["parsed"] == DESCRIPTOR
    assert (form.cleaned_data["text"], form.cleaned_data["step"], form.source) == (
        text, "publish", "descriptor")


def test_an_uploaded_descriptor_wins_and_fills_the_textarea():
    text = yaml.safe_dump(DESCRIPTOR)
    upload = SimpleUploadedFile("rel.yaml", text.encode())
    form = DescriptorForm(query(descriptor="pasted: too"), {"file": upload})

    assert form.is_valid(), form.errors
    assert form.cleaned_data["parsed"] == DESCRIPTOR and form.source == "file"
    assert form["descriptor"].value() == text


@pytest.mark.parametrize("step", ["", "preview", "junk"])
def test_anything_but_publish_is_a_preview(step):
    form = DescriptorForm(query(descriptor="id: x\n", step=step))

    assert form.is_valid() and form.cleaned_data["step"] == "preview"


@pytest.mark.parametrize(("text", "error"), [
    ("", "Paste a descriptor or choose a file."),
    (" \n\t", "Paste a descriptor or choose a file."),
    ("a: [1\n", "descriptor:2: while parsing a flow sequence did not find expected ',' or "
                "']'"),
    ("a: !!int abc\n", "descriptor: a value cannot be converted: invalid literal for int() "
                       "with base 10: 'abc'"),
    ("x" * (256 * 1024 + 1), "descriptor: larger than 262144 bytes."),
])
def test_a_bad_pasted_descriptor_is_an_error_of_its_field(text, error):
    form = DescriptorForm(query(descriptor=text))

    assert not form.is_valid()
    assert form.errors == {"descriptor": [error]}
    assert form["descriptor"].value() == text  # shown again as it was


def test_a_descriptor_beyond_the_yaml_limits_is_refused_by_the_bounded_loader(settings):
    settings.BELLWETHER_LIMITS = {**settings.BELLWETHER_LIMITS, "max_config_depth": 3}
    form = DescriptorForm(query(descriptor="a: {b: {c: {d: 1}}}\n"))

    assert not form.is_valid()
    assert "deep" in form.errors["descriptor"][0], form.errors


@pytest.mark.parametrize(("content", "error"), [
    (b"id: \xff\n", "rel.yaml: not UTF-8 text."),
    (b"x" * (256 * 1024 + 1), "rel.yaml: larger than 262144 bytes."),
    (b"", "The submitted file is empty."),
])
def test_a_bad_upload_is_an_error_of_the_file_field(content, error):
    form = DescriptorForm(query(descriptor="kept"),
                          {"file": SimpleUploadedFile("rel.yaml", content)})

    assert not form.is_valid()
    assert form.errors == {"file": [error]}
    assert form["descriptor"].value() == "kept"


def test_a_refused_descriptor_shape_goes_to_where_it_came_from():
    upload = SimpleUploadedFile("rel.yaml", b"- a list\n")
    form = DescriptorForm(query(), {"file": upload})
    assert form.is_valid()

    assert form.add_refusal(ValidationFailed(
        "descriptor id: required", code="descriptor_invalid",
        details=[{"key": "id", "message": "required"},
                 {"key": "notes", "message": "must be a string"}]))
    assert not form.add_refusal(ValidationFailed("does not merge", code="merge_conflict"))
    assert form.errors == {"file": ["descriptor id: required", "notes: must be a string"]}


@pytest.mark.parametrize(("content", "error"), [
    (b"id: a\x07b\n", "rel.yaml:1: unacceptable character #x0007"),
    (b"id: x\nnotes: a\x1bb\n", "rel.yaml:2: unacceptable character #x001b"),
    (b"id: a\x7f\n", "rel.yaml:1: unacceptable character #x007f"),
    ("id: a\ufffe\n".encode(), "rel.yaml:1: unacceptable character #xfffe"),
    (b"id: \xc0\xae\n", "rel.yaml: not UTF-8 text."),
    (b"id: \xed\xa0\x80\n", "rel.yaml: not UTF-8 text."),
    (b"\tid: x\n", "rel.yaml:1: while scanning"),
    (b"a: " + b"[" * 300, "rel.yaml:1: nesting deeper"),
])
def test_an_upload_yaml_refuses_is_an_error_of_the_file_field(content, error):
    form = DescriptorForm(query(descriptor="kept"),
                          {"file": SimpleUploadedFile("rel.yaml", content)})

    assert not form.is_valid()
    assert list(form.errors) == ["file"]
    assert form.errors["file"][0].startswith(error), form.errors


def test_a_pasted_descriptor_with_a_control_character_names_its_line():
    form = DescriptorForm(query(descriptor="id: x\nnotes: a\x07b\n"))

    assert not form.is_valid()
    assert form.errors["descriptor"][0].startswith("descriptor:2: unacceptable"), form.errors
