"""Who may use the admin API: bearer tokens, compared in constant time, or nobody.

Three modes, decided once when the admin app is built:
- tokens configured (`CANARY_ADMIN_TOKEN`): every request needs `Authorization: Bearer <token>`;
  the token's label becomes the actor written in the promotions audit log;
- no token and `--insecure-admin`: open, but only on a loopback listener and only to loopback
  peers (building the app on any other listener raises ConfigError);
- no token: the admin API is disabled and answers 404.
Tokens are never logged and never echoed back.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from typing import Literal

from domain.errors import ConfigError

Mode = Literal["tokens", "insecure", "disabled"]
INSECURE_ACTOR = "insecure-admin"


def is_loopback(host: str | None) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1, v4-mapped)."""
    if not host:
        return False
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def admin_mode(tokens: Mapping[str, str], insecure: bool, listen_host: str | None) -> Mode:
    """Decide the mode; raise ConfigError for `--insecure-admin` on a non-loopback listener."""
    if tokens:
        return "tokens"
    if not insecure:
        return "disabled"
    if not is_loopback(listen_host):
        raise ConfigError(
            f"key 'admin.insecure': an admin API without a token is only allowed on a loopback "
            f"listener, not on {listen_host!r}; set CANARY_ADMIN_TOKEN or listen on 127.0.0.1"
        )
    return "insecure"


class TokenChecker:
    """Maps an `Authorization` header to the token's label, or None."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._tokens = [(t.encode(), label) for t, label in tokens.items()]

    def label_for(self, authorization: str | None) -> str | None:
        if not authorization:
            return None
        scheme, _, presented = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        candidate = presented.strip().encode("utf-8", "replace")
        found: str | None = None
        # Compare against every token without stopping early, so timing does not tell which
        # (or whether a) token matched.
        for token, label in self._tokens:
            if hmac.compare_digest(candidate, token) and found is None:
                found = label
        return found
