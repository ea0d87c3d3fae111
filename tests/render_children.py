"""Stand-ins for a render in an isolated child (configlang.isolated): module-level,
so the child imports them by reference, and importing nothing of Django."""


def hog(source, seconds):
    """What a bug escaping the budget would do: allocate without end."""
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))


def nothing(source, seconds):
    return None


def hang(source, seconds):
    while True:
        pass


def c_level_hang(*_args, **_kwargs):
    return sum(range(10**13))  # one C call, holding the GIL for hours
