"""Named rollout strategies, pure: the shape of a definition, checked field by field
(every problem names its field), and how a strategy and a request's own fields make
the options of a rollout (the request's win). docs/rollouts.md, "Strategies"."""

from apps.rollouts.rules import WAVE_LIMITS

GATES = ("manual", "auto")
MAX_BAKE_S = 7 * 86400
MAX_COUNT = 10_000
MAX_WAVES = 50
MAX_FAILURE_THRESHOLD = 100_000

# What a rollout takes when neither its request nor a strategy says.
DEFAULTS = {"canary_gate": "manual", "bake_s": 0, "failure_threshold": 0,
            "wave_timeout_s": 3600,
            "waves": [{"percent": 100, "gate": "auto", "bake_s": 0}]}
# The options a strategy may set (and a request override one by one).
OPTIONS = ("canary_count", "canary_percent", "canary_gate", "bake_s", "waves",
           "failure_threshold", "wave_timeout_s")
TOP_FIELDS = {"canary", "canary_gate", "bake_s", "waves", "failure_threshold",
              "wave_timeout_s"}
WAVE_FIELDS = {"percent", "count", "gate", "bake_s", *WAVE_LIMITS}


def _whole(value, low: int, high: int) -> str | None:
    """Why `value` is not a whole number from `low` to `high`, or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"a whole number from {low} to {high}"
    if not low <= value <= high:
        return f"from {low} to {high}"
    return None


def _object_problems(value, allowed: set, where: str) -> list[dict]:
    if not isinstance(value, dict):
        return [{"field": where, "message": "an object"}]
    return [{"field": f"{where}.{key}" if where else str(key), "message": "unknown field"}
            for key in sorted(map(str, value)) if key not in allowed]


def _size_problems(spec: dict, where: str) -> list[dict]:
    """A canary or a wave: a percent (1-100) or a count (1-10,000), exactly one."""
    if ("percent" in spec) == ("count" in spec):
        return [{"field": where, "message": "give a percent or a count, one of them"}]
    key, high = ("percent", 100) if "percent" in spec else ("count", MAX_COUNT)
    problem = _whole(spec[key], 1, high)
    return [{"field": f"{where}.{key}", "message": problem}] if problem else []


def _wave_problems(wave, where: str) -> list[dict]:
    problems = _object_problems(wave, WAVE_FIELDS, where)
    if problems or not isinstance(wave, dict):
        return problems
    problems = _size_problems(wave, where)
    if "gate" in wave and wave["gate"] not in GATES:
        problems.append({"field": f"{where}.gate", "message": "manual or auto"})
    checks = {"bake_s": (0, MAX_BAKE_S), "max_in_flight": (1, MAX_COUNT),
              "max_failures": (1, MAX_COUNT)}
    for key, (low, high) in checks.items():
        problem = _whole(wave[key], low, high) if key in wave else None
        if problem:
            problems.append({"field": f"{where}.{key}", "message": problem})
    return problems


def _ascending_problems(waves: list) -> list[dict]:
    """Waves never shrink: each percent (or count) at least the one before it."""
    problems, last = [], {}
    for index, wave in enumerate(waves):
        for key in ("percent", "count"):
            if key in wave and key in last and wave[key] < last[key]:
                problems.append({"field": f"waves[{index}].{key}",
                                 "message": f"waves ascend: at least {last[key]}"})
            if key in wave:
                last[key] = wave[key]
    return problems


def _waves_problems(waves) -> list[dict]:
    if not isinstance(waves, list) or not 1 <= len(waves) <= MAX_WAVES:
        return [{"field": "waves", "message": f"a list of 1 to {MAX_WAVES} waves"}]
    problems = [p for i, wave in enumerate(waves) for p in _wave_problems(wave, f"waves[{i}]")]
    return problems or _ascending_problems(waves)


def strategy_problems(definition) -> list[dict]:
    """[{field, message}] of everything wrong with a strategy's definition (empty
    when it is good): known fields only, percentages 1-100, counts 1-10,000, waves
    ascending, bake times 0 to 7 days, a wave timeout of 60 s to 7 days."""
    problems = _object_problems(definition, TOP_FIELDS, "")
    if problems or not isinstance(definition, dict):
        return problems
    if "canary" in definition:
        canary = definition["canary"]
        problems += (_object_problems(canary, {"percent", "count"}, "canary")
                     or _size_problems(canary, "canary"))
    if "canary_gate" in definition and definition["canary_gate"] not in GATES:
        problems.append({"field": "canary_gate", "message": "manual or auto"})
    for key, (low, high) in {"bake_s": (0, MAX_BAKE_S),
                             "failure_threshold": (0, MAX_FAILURE_THRESHOLD),
                             "wave_timeout_s": (60, MAX_BAKE_S)}.items():
        problem = _whole(definition[key], low, high) if key in definition else None
        if problem:
            problems.append({"field": key, "message": problem})
    if "waves" in definition:
        problems += _waves_problems(definition["waves"])
    return problems


def strategy_options(definition: dict) -> dict:
    """A (checked) definition as rollout options: its canary as canary_count or
    canary_percent."""
    options = {k: v for k, v in definition.items() if k != "canary"}
    canary = definition.get("canary") or {}
    if "count" in canary:
        options["canary_count"] = canary["count"]
    if "percent" in canary:
        options["canary_percent"] = canary["percent"]
    return options


def rollout_options(definition: dict | None, given: dict) -> dict:
    """The options of a rollout: the defaults, then the strategy's, then those the
    request set itself. Canaries the request names (agents or labels) replace the
    strategy's canary size."""
    options = {**DEFAULTS, **strategy_options(definition or {})}
    if given.get("canary_agents") or given.get("canary_labels"):
        options.pop("canary_count", None), options.pop("canary_percent", None)
    return {**options, **{k: v for k, v in given.items() if v is not None}}
