"""The dashboard's forms: every value a page sends (a field, a hidden input, a query
parameter) comes in through one of these.

Numbers are positive whole numbers in ASCII digits with a bound: a sign, a space, a
decimal point, a digit like "²" or "٣", or a thousand digits are a form error
(a 400), never a server error. A refusal from a service that is about one of a
form's fields is attached to that field (DashboardForm.add_refusal).
"""

from django import forms
from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from apps.core.errors import ApplicationError
from apps.core.events import DOMAIN_EVENTS
from apps.core.text import whole_number
from apps.core.validators import WholeNumberFormField
from apps.environments.models import Environment
from apps.rollouts.models import Rollout
from configlang.yamlconfig import load_yaml

MAX_DESCRIPTOR_BYTES = 256 * 1024
NUMBER_MAX = 2**31 - 1  # snapshot numbers, rollout versions
AGENT_ID_MAX = 2**63 - 1
# The degenerate-render guard's checkbox (the API's `confirm`) on every release form.
CONFIRM_LABEL = "Release it even if a file is emptied or the files shrink sharply"


class NumberField(forms.IntegerField):
    """A whole number from 1 to `maximum` written in ASCII digits. Every way to get
    it wrong (missing, malformed, out of bounds) is the one `message`."""

    def __init__(self, message: str, *, maximum: int = NUMBER_MAX, minimum: int = 1, **kwargs):
        super().__init__(min_value=minimum, max_value=maximum, error_messages=dict.fromkeys(
            ("required", "invalid", "min_value", "max_value"), message), **kwargs)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        number = whole_number(str(value), maximum=self.max_value)  # the API's rule too
        if number is None:
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return number


class NumberListField(forms.Field):
    """Several NumberFields under one name (checkboxes): a list of numbers."""

    widget = forms.CheckboxSelectMultiple

    def __init__(self, message: str, *, maximum: int = NUMBER_MAX, **kwargs):
        self.number = NumberField(message, maximum=maximum)
        kwargs.setdefault("error_messages", {"required": message})
        super().__init__(**kwargs)

    def to_python(self, value) -> list[int]:
        if value in self.empty_values:
            return []
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [self.number.clean(item) for item in value]


def _detail(detail) -> str:
    """One entry of a refusal's details as a line: "file:line key: message"."""
    if not isinstance(detail, dict) or "message" not in detail:
        return str(detail)
    where = ":".join(str(detail[part]) for part in ("file", "line") if part in detail)
    if "key" in detail:
        where = f"{where} {detail['key']}".strip()
    return f"{where}: {detail['message']}" if where else detail["message"]


class DashboardForm(forms.Form):
    """A dashboard form: knows which of its fields a service's refusal is about."""

    # A refusal's code -> the field it is about.
    refusal_fields: dict[str, str] = {}

    def refusal_field(self, error: ApplicationError) -> str | None:
        return self.refusal_fields.get(error.code)

    def add_refusal(self, error: ApplicationError, field: str | None = None) -> bool:
        """Attach a service's refusal to `field`, else to the field its code is about,
        with each further entry of its details; False when it is about none of them
        (the page shows it as a whole)."""
        field = field or self.refusal_field(error)
        if field not in self.fields:
            return False
        details = error.details if isinstance(error.details, list) else []
        self.add_error(field, [error.message, *(_detail(d) for d in details[1:])])
        return True

    def error_lines(self) -> list[str]:
        """Every error as "field: message", for forms whose fields are hidden (the
        flash says what went wrong)."""
        return [message if field == NON_FIELD_ERRORS else f"{field}: {message}"
                for field, messages in self.errors.items() for message in messages]


class DescriptorForm(DashboardForm):
    """A descriptor pasted or uploaded (the file wins), parsed with the bounded YAML
    loader: cleaned_data["text"] and ["parsed"], and `source`, the field it came
    from (where its problems are shown)."""

    descriptor = forms.CharField(required=False, strip=False, widget=forms.Textarea(
        attrs={"rows": 14, "spellcheck": "false", "class": "code"}))
    file = forms.FileField(required=False, widget=forms.FileInput(
        attrs={"accept": ".yaml,.yml,.json,text/yaml,application/json"}))
    step = forms.CharField(required=False)
    confirm = forms.BooleanField(required=False, label=CONFIRM_LABEL)

    def __init__(self, *args, environment=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.source = "descriptor"
        if environment is not None:
            self.fields["descriptor"].widget.attrs["placeholder"] = (
                f"apiVersion: bellwether/v1\napplication: {environment.application.name}\n"
                f"environment: {environment.name}\nid: release-2026-12-01\n"
                'version: "1.4.2"\nparams: {}')

    def refusal_field(self, error: ApplicationError) -> str | None:
        # The descriptor's shape, or its target: what was pasted or uploaded is wrong.
        return self.source if error.code == "descriptor_invalid" else None

    def clean_step(self) -> str:
        return "publish" if self.cleaned_data["step"] == "publish" else "preview"

    def clean(self):
        cleaned = super().clean()
        upload = cleaned.get("file")
        if self.has_error("file") or self.has_error("descriptor"):
            return cleaned
        if upload:
            self.source, name = "file", upload.name
            if upload.size > MAX_DESCRIPTOR_BYTES:
                raise ValidationError(
                    {"file": f"{name}: larger than {MAX_DESCRIPTOR_BYTES} bytes."})
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError({"file": f"{name}: not UTF-8 text."}) from None
            # The textarea shows the file's text, to edit and preview again.
            self.data = self.data.copy()
            self.data["descriptor"] = text
        else:
            text, name = cleaned.get("descriptor") or "", "descriptor"
        if not text.strip():
            raise ValidationError({"descriptor": "Paste a descriptor or choose a file."})
        if len(text.encode()) > MAX_DESCRIPTOR_BYTES:
            raise ValidationError(
                {self.source: f"{name}: larger than {MAX_DESCRIPTOR_BYTES} bytes."})
        parsed, problems = load_yaml(text, limits=settings.BELLWETHER_LIMITS, file=name)
        if problems:
            raise ValidationError({self.source: [str(problem) for problem in problems]})
        cleaned["text"], cleaned["parsed"] = text, parsed
        return cleaned


class DiffForm(DashboardForm):
    """Two snapshots to compare (query parameters): `to`, and `from` (left out: the
    previous ready one). Without `to`, nothing is compared yet."""

    to = NumberField("pick a snapshot number.", required=False, widget=forms.Select)

    def __init__(self, *args, snapshots=(), **kwargs):
        super().__init__(*args, **kwargs)
        ready = [(s.number, f"#{s.number} {s.label}") for s in snapshots if s.state == "ready"]
        self.fields["from"] = NumberField("pick a snapshot number.", required=False,
                                          widget=forms.Select)
        self.fields["from"].widget.choices = [("", "the previous ready one"), *ready]
        self.fields["to"].widget.choices = ready


GATES = {Rollout.Gate.MANUAL: "manual: an operator confirms each wave",
         Rollout.Gate.AUTO: "automatic: on fresh acknowledgements from the whole wave"}
WAVES_MESSAGE = "percentages from 1 to 100, separated by commas."
WEEK_S = 7 * 86400  # the API's bound on bake times and wave timeouts
MAX_CANARY_LABELS = 20
LABELS_MESSAGE = "labels as key=value, separated by commas."


def _labels(text: str) -> dict[str, str]:
    """"team=web, zone=a" as {"team": "web", "zone": "a"}; a part that is not
    key=value (both non-empty, at most 63 characters) is LABELS_MESSAGE."""
    labels = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        if not (sep and key and value) or len(key) > 63 or len(value) > 63:
            raise ValidationError(LABELS_MESSAGE)
        labels[key] = value
    if len(labels) > MAX_CANARY_LABELS:
        raise ValidationError(f"at most {MAX_CANARY_LABELS} labels.")
    return labels


class RolloutForm(DashboardForm):
    """A staged rollout: a snapshot (offered: `snapshots`, the ready ones newer than
    the active one and not quarantined, newest first and chosen), canaries by agent
    (offered: `agents`), by labels or by percent of the agents, then waves by
    percent behind one gate; a bake time every wave waits after it is acknowledged,
    the failures tolerated and how long a wave may wait before the rollout pauses.
    cleaned_data["plan"] is the waves as rollout_create takes them."""

    snapshot = NumberField("pick a snapshot to roll out.", widget=forms.Select)
    # A strategy chosen gives the waves and their settings (docs/rollouts.md).
    strategy = forms.ChoiceField(required=False, choices=[("", "none: the fields below")])
    canary = NumberListField("not an agent id.", maximum=AGENT_ID_MAX, required=False,
                             widget=forms.CheckboxSelectMultiple(attrs={"class": "checks"}))
    canary_labels = forms.CharField(required=False, max_length=2000, widget=forms.TextInput(
        attrs={"placeholder": "e.g. zone=eu-1, tier=canary"}))
    canary_percent = NumberField("a percentage from 1 to 100.", maximum=100, required=False)
    waves = forms.CharField(initial="50, 100", required=False)  # blank: the strategy's
    gate = forms.ChoiceField(choices=[(gate, GATES[gate]) for gate in Rollout.Gate.values],
                             initial=Rollout.Gate.MANUAL, error_messages={
                                 "invalid_choice": f"one of {', '.join(Rollout.Gate.values)}.",
                                 "required": f"one of {', '.join(Rollout.Gate.values)}."})
    bake_s = NumberField(f"seconds, from 0 to {WEEK_S}.", minimum=0, maximum=WEEK_S,
                         initial=0)
    failure_threshold = NumberField("a number of agents, from 0 to 100000.", minimum=0,
                                    maximum=100_000, initial=0)
    wave_timeout_s = NumberField(f"seconds, from 60 to {WEEK_S}.", minimum=60, maximum=WEEK_S,
                                 initial=3600)
    # A post that leaves these out (from a script, say) gets one wave behind a manual
    # gate, no bake time, no failure tolerated, an hour per wave.
    defaults = {"waves": "100", "gate": Rollout.Gate.MANUAL, "bake_s": "0",
                "failure_threshold": "0", "wave_timeout_s": "3600"}
    confirm = forms.BooleanField(required=False, label=CONFIRM_LABEL)
    refusal_fields = {"not_found": "snapshot", "quarantined": "snapshot",
                      "nothing_to_roll_out": "snapshot", "confirmation_required": "confirm",
                      "no_canaries": "canary", "canary_not_target": "canary",
                      "unknown_agents": "canary"}

    def __init__(self, data=None, *args, snapshots=(), agents=(), chosen=None,
                 strategies=(), **kwargs):
        if data is not None:
            data = data.copy()
            for name, value in self.defaults.items():
                if name not in data:
                    data[name] = value
        super().__init__(data, *args, **kwargs)
        offered = [s for s in snapshots if s.state == "ready"]
        self.fields["snapshot"].widget.choices = [(s.number, f"#{s.number} {s.label}")
                                                  for s in offered]
        if offered:
            self.fields["snapshot"].initial = offered[0].number
        try:
            chosen = self.fields["snapshot"].to_python(chosen)
        except ValidationError:
            chosen = None
        if chosen in {s.number for s in offered}:
            self.fields["snapshot"].initial = chosen
        self.fields["canary"].widget.choices = [(agent.pk, agent.name) for agent in agents]
        self.fields["strategy"].choices = [("", "none: the fields below"),
                                           *[(s.name, str(s)) for s in strategies]]

    def clean_waves(self) -> list[int] | None:
        parts = [p.strip().rstrip("%") for p in self.cleaned_data["waves"].split(",")]
        parts = [p for p in parts if p]
        if not parts and self.cleaned_data.get("strategy"):
            return None  # the strategy's waves
        if not parts:
            raise ValidationError(WAVES_MESSAGE)
        number = NumberField(WAVES_MESSAGE, maximum=100)
        return [number.clean(part) for part in parts]

    def clean_canary_labels(self) -> dict[str, str]:
        return _labels(self.cleaned_data["canary_labels"])

    def clean(self):
        cleaned = super().clean()
        if not any(self.has_error(f) for f in ("canary", "canary_labels", "canary_percent")) \
                and not (cleaned.get("canary") or cleaned.get("canary_labels")
                         or cleaned.get("canary_percent") or cleaned.get("strategy")):
            self.add_error("canary", "Name the canaries: pick at least one agent.")
        cleaned["plan"] = None
        if cleaned.get("waves") and "gate" in cleaned and "bake_s" in cleaned:
            cleaned["plan"] = [{"percent": percent, "gate": cleaned["gate"],
                                "bake_s": cleaned["bake_s"]} for percent in cleaned["waves"]]
        return cleaned


ALL_AGENTS = "all"


class AgentChoiceField(NumberField):
    """One agent id, or ALL_AGENTS (cleaned to None: every enabled agent). Nothing
    chosen is an error: a push to every agent is always asked for by name."""

    def __init__(self, message: str, *, required_message: str, **kwargs):
        super().__init__(message, **kwargs)
        self.error_messages["required"] = required_message

    def clean(self, value):
        if value == ALL_AGENTS:
            return None
        return super().clean(value)


class DeployForm(DashboardForm):
    """Deploy now: a snapshot (left out: the active one) to one agent, or to every
    enabled agent when `agent` is "all" (the "to all" button). Left out or empty is
    an error, as the API's `agents` is required."""

    snapshot = NumberField("not a snapshot number.", required=False, widget=forms.HiddenInput)
    agent = AgentChoiceField("not an agent id.", maximum=AGENT_ID_MAX, widget=forms.HiddenInput,
                             required_message="choose an agent, or all agents.")
    # The page pushes the active snapshot (never degenerate against itself); a post
    # naming another one confirms its degenerate render here, as the API's `confirm`.
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, active=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.active = active

    def clean_snapshot(self) -> int:
        number = self.cleaned_data["snapshot"]
        if number is None and self.active is None:
            raise ValidationError("nothing to deploy yet: publish a snapshot first.")
        return self.active.number if number is None else number


class ReleasePolicyForm(DashboardForm):
    """An owner's change of the release policy, at the version the page showed."""

    release_policy = forms.ChoiceField(
        choices=Environment.ReleasePolicy.choices, widget=forms.RadioSelect,
        error_messages={"invalid_choice": "direct or staged.", "required": "direct or staged."})
    expected_version = NumberField("reload the page and try again.",
                                   widget=forms.HiddenInput)


class DriftPolicyForm(DashboardForm):
    """An owner's change of the drift policy, at the version the page showed."""

    drift_policy = forms.ChoiceField(
        choices=Environment.DriftPolicy.choices, widget=forms.RadioSelect,
        error_messages={"invalid_choice": "report or restore.",
                        "required": "report or restore."})
    expected_version = NumberField("reload the page and try again.",
                                   widget=forms.HiddenInput)


class RolloutActionForm(DashboardForm):
    """Confirm or roll back a rollout: the version the page showed it at."""

    expected_version = NumberField("reload the page and try again.",
                                   widget=forms.HiddenInput)


class PromoteForm(DashboardForm):
    """Promote another environment's active snapshot here: which one, the number the
    preview showed (a newer one since is refused), and the degenerate-render checkbox."""

    source = forms.ChoiceField(label="From")
    number = WholeNumberFormField(required=False, min_value=1, max_value=2**31 - 1,
                                  widget=forms.HiddenInput)
    confirm = forms.BooleanField(required=False, label=CONFIRM_LABEL)
    refusal_fields = {"promotion_scope": "source", "no_active_snapshot": "source",
                      "stale": "number", "confirmation_required": "confirm"}

    def __init__(self, *args, sources=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["source"].choices = [(name, name) for name in sources]


class RollbackForm(DashboardForm):
    """Roll back to a snapshot: the degenerate-render checkbox."""

    confirm = forms.BooleanField(required=False, label=CONFIRM_LABEL)
    refusal_fields = {"confirmation_required": "confirm"}


class SnapshotRemoveForm(DashboardForm):
    reason = forms.CharField(max_length=500, strip=True)


class WebhookForm(DashboardForm):
    """A new webhook endpoint: its URL and the events it takes (the service checks
    both and names the field of a refusal)."""

    url = forms.CharField(max_length=2000, strip=False)  # refused with whitespace
    events = forms.MultipleChoiceField(choices=[(e, e) for e in DOMAIN_EVENTS],
                                       widget=forms.CheckboxSelectMultiple(
                                           attrs={"class": "checks"}))
    description = forms.CharField(max_length=200, required=False)

    def refusal_field(self, error: ApplicationError) -> str | None:
        details = error.details if isinstance(error.details, list) else []
        field = details[0].get("field") if details and isinstance(details[0], dict) else None
        return field if field in self.fields else None


class WebhookActionForm(DashboardForm):
    endpoint = NumberField("not a webhook endpoint.")
