"""What a name, label or file path may hold: characters a person sees. The one rule
(the server's names and labels, apps.core.text, and file paths, configlang.rendering)."""

import unicodedata

# Control, format (bidirectional overrides, zero-width), surrogate, private-use,
# unassigned, line and paragraph separators.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): rendered as
# nothing, whatever their category (U+115F HANGUL CHOSEONG FILLER is a letter).
DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def is_default_ignorable(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in DEFAULT_IGNORABLE)


def _described(char: str) -> str:
    return f"U+{ord(char):04X} ({unicodedata.name(char, 'unnamed')})"


def invisible_problem(value: str) -> str | None:
    """Why `value` holds something a reader cannot see or tell apart, or None:
    a control, format, private-use, unassigned or separator character, a default-
    ignorable one, a space other than U+0020 (NBSP, ideographic space, …), or
    whitespace at either end."""
    for char in value:
        category = unicodedata.category(char)
        if category in INVISIBLE_CATEGORIES or is_default_ignorable(char):
            return f"contains the control or formatting character {_described(char)}"
        if category == "Zs" and char != " ":
            return f"contains the space character {_described(char)}; only U+0020 is allowed"
    if value != value.strip():
        return "starts or ends with whitespace"
    return None
