"""Per-user relay tokens: what a tool on loopback TCP shows instead of the provider's key.

A token is `tgr_` and 32 random bytes (urlsafe base64). The daemon keeps only its SHA-256, per
uid, in `relay-tokens.json` (0600) in the state directory, so a copy of the state directory
grants nothing. Issuing a token replaces the uid's previous one; revoking removes it.
A token is a credential of the user's, never of the provider: leaking one exposes that
user's relay use (revocable) and never the daemon's key.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
from pathlib import Path

PREFIX = "tgr_"
FILE_NAME = "relay-tokens.json"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


class TokenStore:
    """uid → sha256(token), in memory and on disk (None: memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._by_uid: dict[int, str] = self._read()
        self._by_digest = {value: uid for uid, value in self._by_uid.items()}

    def issue(self, uid: int) -> str:
        """A new token for `uid`; its previous one stops working now."""
        token = PREFIX + secrets.token_urlsafe(32)
        self._by_digest.pop(self._by_uid.get(uid, ""), None)
        self._by_uid[uid] = digest(token)
        self._by_digest[self._by_uid[uid]] = uid
        self._write()
        return token

    def revoke(self, uid: int) -> bool:
        old = self._by_uid.pop(uid, None)
        if old is None:
            return False
        self._by_digest.pop(old, None)
        self._write()
        return True

    def uid_of(self, token: str) -> int | None:
        """The uid a token belongs to. A dict lookup on the hash: the time taken says nothing
        about the token's own bytes."""
        if not token.startswith(PREFIX):
            return None
        return self._by_digest.get(digest(token))

    def has(self, uid: int) -> bool:
        return uid in self._by_uid

    def fingerprint(self, uid: int) -> str | None:
        """The first 16 hex digits of the uid's token hash: its owner's client compares them
        with its saved copy (`relay env`). Shown to that uid only; it grants nothing."""
        value = self._by_uid.get(uid)
        return None if value is None else value[:16]

    def _read(self) -> dict[int, str]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text())
            return {int(uid): str(value) for uid, value in raw.items()}
        except (OSError, ValueError, AttributeError):
            return {}  # unreadable: every user fetches a new token

    def _write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({str(uid): value for uid, value in self._by_uid.items()})
        fd, staging = tempfile.mkstemp(dir=self.path.parent, prefix=".relay-tokens.")
        with os.fdopen(fd, "w") as out:  # mkstemp makes it 0600
            out.write(data)
        Path(staging).replace(self.path)
