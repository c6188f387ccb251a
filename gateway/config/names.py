"""The names a setting goes by besides its dotted place (`section.key`): the flat keys of before
the sections (in files and as CANARY_<OLD_KEY> variables) and every CANARY_ environment variable.
"""

from __future__ import annotations

from typing import Final

import msgspec

from domain.errors import ConfigError
from gateway.config.sections import SECTIONS

# Flat keys of before the sections -> their dotted place (files and CANARY_<OLD_KEY> variables).
# fmt: off
FLAT_KEYS: Final[dict[str, str]] = {
    **{k: f"server.{k}" for k in (
        "listen", "workers", "log_format", "log_level", "replica_name", "event_loop",
        "session_header", "drain_timeout_s",
    )},
    **{f"live_{k}": f"live.{k}" for k in ("url", "name", "price_per_hour_usd", "gpus")},
    "upstream_max_connections": "upstream.max_connections",
    "upstream_keepalive_s": "upstream.keepalive_s",
    **{k: f"upstream.{k}" for k in (
        "connect_timeout_s", "ttfb_timeout_s", "idle_timeout_s", "total_timeout_s",
    )},
    **{k: f"limits.{k}" for k in (
        "max_body_bytes", "max_body_bytes_in_flight", "body_read_timeout_s",
        "header_read_timeout_s", "keepalive_timeout_s", "max_connections",
        "client_write_timeout_s", "bad_request_log_interval_s",
    )},
    "credential_headers": "credentials.headers",
    "candidate_credentials_prefix": "credentials.candidate_prefix",
    "candidate_credentials_allow": "credentials.candidate_allow",
    **{f"mirror_{k}": f"mirror.{k}" for k in (
        "memory_budget_bytes", "shed_loop_lag_ms", "shed_cpu_busy", "shed_window_s",
        "channel_max_bytes", "priority", "nice", "results_max",
    )},
    **{k: f"mirror.{k}" for k in (
        "dedup_window_s", "score_logprobs", "score_concurrency", "score_max_pending",
        "answer_wait_s", "token_counter", "tokenize_concurrency", "tokenize_max_pending",
        "tokenize_timeout_s", "tokenize_cache_entries",
        "grading_max_pending", "grading_concurrency", "grading_timeout_s", "grading_max_chars",
        "tool_check", "tool_schema_cache", "tool_schema_max_bytes",
    )},
    "report_process": "reports.enabled",
    **{f"report_{k}": f"reports.{k}" for k in (
        "priority", "nice", "concurrency", "max_pairs", "spill_over_bytes", "spill_dir",
        "queue_max", "timeout_s", "start_wait_s", "refresh_interval_s",
    )},
    **{k: f"storage.{k}" for k in (
        "db_url", "store_text", "store_text_max_chars", "writer_batch_size",
        "writer_flush_interval_s", "writer_queue_max", "registry_poll_interval_s",
        "counters_flush_interval_s",
    )},
    "capture": "capture.enabled",
    **{f"capture_{k}": f"capture.{k}" for k in (
        "share", "candidates", "max_bytes", "max_body_bytes", "retention_s", "queue_max",
        "redact_fields", "redact_headers", "despite_store_text_off",
    )},
    "insecure_admin": "admin.insecure",
    **{f"admin_{k}": f"admin.{k}" for k in (
        "token", "listen", "max_connections", "token_min_length", "auth_failures_allowed",
        "auth_backoff_max_s", "labeller_token", "label_retention_s", "label_double_rate",
    )},
}


ENV_PREFIX = "CANARY_"


def _env_names() -> dict[str, str]:
    names = {ENV_PREFIX + old.upper(): dotted for old, dotted in FLAT_KEYS.items()}
    for section, cls in SECTIONS.items():
        for f in msgspec.structs.fields(cls):
            new = f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}"
            dotted = f"{section}.{f.name}"
            if names.setdefault(new, dotted) != dotted:
                raise ConfigError(f"{new} would name both {names[new]} and {dotted}")
    return names


# Every CANARY_ variable that configures the gateway -> its dotted key: the sectioned name
# (CANARY_REPORTS_MAX_PAIRS) and the flat name of before the sections (CANARY_REPORT_MAX_PAIRS).
ENV_VARIABLES: Final[dict[str, str]] = _env_names()
