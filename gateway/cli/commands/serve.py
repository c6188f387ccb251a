"""`canary serve`: run the gateway in front of the live endpoint.

Flags override the TOML file (`--config`) and `CANARY_*` environment variables; `load_config`
merges and validates them, and a bad setting stops here with exit code 2 and one message naming
the source, the key and the reason (raised as `ConfigError`, printed by `gateway.cli.main`).
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "serve",
        help="run the gateway (reverse proxy in front of the live endpoint)",
        description=(
            "Forward every request to the live endpoint and stream answers back unchanged. "
            "Without --live (or live_url in the config), a built-in engine simulator serves as "
            "the live endpoint."
        ),
    )
    parser.add_argument("--config", metavar="PATH", help="TOML config file")
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)"
    )
    parser.add_argument(
        "--live", metavar="URL", dest="live_url", help="the live endpoint's base URL"
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        dest="db_url",
        help="database URL (default sqlite+aiosqlite:///./canary.db)",
    )
    parser.add_argument(
        "--workers", type=int, metavar="N", help="processes sharing the port (SO_REUSEPORT)"
    )
    parser.add_argument("--log-format", choices=("json", "text"), help="log line format")
    parser.add_argument(
        "--insecure-admin",
        action="store_true",
        default=None,
        help="allow the admin API without a token (local development only)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gateway.config.load import load_config
    from gateway.logs import setup_logging
    from gateway.process.workers import serve_forever

    overrides = {
        "listen": args.listen,
        "live_url": args.live_url,
        "db_url": args.db_url,
        "workers": args.workers,
        "log_format": args.log_format,
        "insecure_admin": args.insecure_admin,
    }
    config = load_config(args.config, overrides=overrides)
    setup_logging(config.server.log_format, config.server.log_level)
    return serve_forever(config)
