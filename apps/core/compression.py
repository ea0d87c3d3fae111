"""Stored gzip: bytes compressed once and served as they are to clients that accept it."""

import gzip


def compressed(data: bytes) -> bytes:
    """`data` gzip-compressed, the same bytes for the same input (no timestamp)."""
    return gzip.compress(data, compresslevel=6, mtime=0)


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding header (RFC 9110 12.5.3) accepts gzip: `gzip`,
    `x-gzip` or `*` with a weight above 0 (`gzip;q=0` refuses it, and an explicit
    `gzip;q=0` wins over `*`)."""
    weights = {}
    for item in (accept_encoding or "").split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        weight = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0
        weights[coding] = weight
    for coding in ("gzip", "x-gzip"):
        if coding in weights:
            return weights[coding] > 0
    return weights.get("*", 0.0) > 0
