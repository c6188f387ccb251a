"""Candidate credentials: the one place that reads the variable a `credentials_env` names.

A stored endpoint may predate the policy, or come from a database another gateway wrote: at
load, a name the policy refuses (`[credentials] candidate_prefix`, `candidate_allow`,
never a gateway setting) gives the candidate no credential at all, is logged once per
(endpoint, name) and counted in `canary_candidate_credentials_refused_total`.
This module must never log, return or store a credential's value.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Final

from domain.exposition import Family, Sample
from gateway.config.load import credential_env_refusal
from gateway.config.sections import CredentialsConfig

log = logging.getLogger("canary.credentials")

CREDENTIALS_REFUSED: Final = Family(
    "canary_candidate_credentials_refused_total",
    "counter",
    "Candidate credential lookups refused by the credentials_env policy (the copy is sent "
    "without a credential).",
)


class _Refusals:
    """Process-wide count of refused lookups, and the (endpoint, name) pairs already logged."""

    def __init__(self) -> None:
        self.count = 0
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def refuse(self, endpoint: str, name: str, reason: str) -> None:
        with self._lock:
            self.count += 1
            first = (endpoint, name) not in self._logged
            # Bounded: one entry per registered endpoint and name, which the registry bounds.
            self._logged.add((endpoint, name))
        if first:
            log.warning(
                "candidate credential refused: the endpoint names a variable it may not read",
                extra={"fields": {"endpoint": endpoint, "credentials_env": name, "why": reason}},
            )

    def prometheus_lines(self) -> list[Sample]:
        return [CREDENTIALS_REFUSED.sample(self.count)]


REFUSALS = _Refusals()


def candidate_credential(
    credentials: CredentialsConfig,
    endpoint: str,
    name: str | None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The value of the variable `name` for candidate `endpoint`, or None (unset, empty, or
    refused by the policy: then logged once and counted)."""
    if not name:
        return None
    reason = credential_env_refusal(credentials, name)
    if reason is not None:
        REFUSALS.refuse(endpoint, name, reason)
        return None
    return (os.environ if environ is None else environ).get(name) or None
