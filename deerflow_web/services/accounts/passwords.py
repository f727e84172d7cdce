"""Password rules and hashing (SPEC 7.5): argon2id, a length floor and a common-password list.

A login for an unknown email verifies the password against a dummy hash, so it costs as much
as a wrong password for a real account and the answer time tells nothing.
"""

from __future__ import annotations

import re
from functools import cache
from functools import cached_property
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError
from argon2.exceptions import VerificationError
from argon2.exceptions import VerifyMismatchError

from deerflow_web.errors import InvalidEmail
from deerflow_web.errors import WeakPassword

MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024  # hashing a megabyte-long password is work for nothing
MAX_EMAIL_LENGTH = 320
COMMON_PASSWORDS_FILE = Path(__file__).with_name("common-passwords.txt")

# Deliberately loose: one @, something on each side, a dot in the domain, no spaces.
EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")


@cache
def common_passwords() -> frozenset[str]:
    """The bundled list, lower-cased; comment lines start with `#`."""
    lines = COMMON_PASSWORDS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip().lower() for line in lines if line and not line.startswith("#"))


def normalize_email(raw: object) -> str:
    """Trimmed and lower-cased, or InvalidEmail."""
    if not isinstance(raw, str):
        raise InvalidEmail("Email must be a string")
    email = raw.strip().lower()
    if len(email) > MAX_EMAIL_LENGTH or EMAIL_RE.fullmatch(email) is None:
        raise InvalidEmail("Invalid email address")
    return email


def check_password_rules(password: object) -> str:
    """Return the password if it is acceptable, or raise WeakPassword saying why."""
    if not isinstance(password, str):
        raise WeakPassword("Password must be a string")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"Password must be at least {MIN_PASSWORD_LENGTH} characters long")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise WeakPassword(f"Password must be at most {MAX_PASSWORD_LENGTH} characters long")
    if password.lower() in common_passwords():
        raise WeakPassword("This password is too common; choose another one")
    return password


class Passwords:
    """argon2id hashing with one set of parameters, plus the dummy hash for unknown emails."""

    def __init__(self, hasher: PasswordHasher | None = None) -> None:
        self._hasher = hasher or PasswordHasher()

    @cached_property
    def _dummy(self) -> str:
        """Made when first needed: hashing it costs as much as a sign-in, at every start-up."""
        return self._hasher.hash("not a password of anyone")

    def hash(self, password: str) -> str:
        """A self-describing argon2id hash (parameters and salt included)."""
        return self._hasher.hash(password)

    def verify(self, password_hash: str | None, password: str) -> bool:
        """Whether `password` matches; None (unknown account) costs the same and fails."""
        try:
            self._hasher.verify(password_hash or self._dummy, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False
        return password_hash is not None
