"""Bearer token format shared by user and agent tokens: `<prefix>_<key>.<secret>`.

The key finds the row; only a SHA-256 of the high-entropy secret is stored and it
is compared in constant time.
"""

import hashlib
import hmac
import re
import secrets
from typing import NamedTuple

_TOKEN_ALPHABET = re.compile(r"[A-Za-z0-9_\-]{1,512}")


class IssuedToken(NamedTuple):
    key: str
    secret_hash: str
    plaintext: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue(prefix: str) -> IssuedToken:
    key = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return IssuedToken(key, hash_secret(secret), f"{prefix}_{key}.{secret}")


def parse(token: str, prefix: str) -> tuple[str, str] | None:
    """Split a presented token into (key, secret), or None if it is not ours."""
    if not token.startswith(f"{prefix}_"):
        return None
    key, sep, secret = token[len(prefix) + 1 :].partition(".")
    if not sep or not key or not secret or len(key) > 16:
        return None
    # Only the alphabets issue() uses: anything else (NUL, non-ASCII) is no token
    # of ours and must never reach a query or the hash.
    if not (_TOKEN_ALPHABET.fullmatch(key) and _TOKEN_ALPHABET.fullmatch(secret)):
        return None
    return key, secret


def secret_matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), secret_hash)
