"""deploy/nginx and deploy/envoy: the session-affine fronts. The nginx file passes `nginx -t`
(the end-to-end fleet test runs it in front of two replicas, tests/process/test_fleet.py); the
Envoy file parses strictly into Envoy's own API messages (the xds-protos package: a misspelt or
unknown field fails) and keys its balancing on x-session-id with ring_hash."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401 - registers the type
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from google.protobuf import json_format

from bench._shared.nginx import MISSING, ROOT, find_nginx
from bench._shared.nginx import nginx_conf as nginx_conf

ENVOY_YAML = ROOT / "deploy" / "envoy" / "envoy.yaml"


def nginx_binary() -> str:
    """The nginx binary; a skip when it is missing (a failure under CANARY_REQUIRE_NGINX=1)."""
    exe = find_nginx()
    if exe is None:
        if os.environ.get("CANARY_REQUIRE_NGINX") == "1":
            pytest.fail(f"CANARY_REQUIRE_NGINX=1 but {MISSING}", pytrace=False)
        pytest.skip(MISSING)
    return exe


def test_nginx_example_passes_nginx_t(tmp_path: Path) -> None:
    """The shipped nginx file, pointed at local addresses, is accepted by nginx itself."""
    conf = nginx_conf(tmp_path, 18000, ["127.0.0.1:18001", "127.0.0.1:18002"])
    run = subprocess.run(
        [nginx_binary(), "-t", "-p", str(tmp_path), "-c", str(conf)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert "hash $canary_session consistent;" in conf.read_text()
    assert re.search(
        r'map \$http_x_session_id \$canary_session \{\s*""\s+\$request_id;', conf.read_text()
    )


def _bootstrap(doc: dict[str, Any]) -> bootstrap_pb2.Bootstrap:
    return json_format.ParseDict(doc, bootstrap_pb2.Bootstrap())


def test_envoy_example_is_valid_and_keyed_on_the_session() -> None:
    """envoy.yaml parses into Envoy's Bootstrap message with no unknown field; the route hashes
    x-session-id first (terminal) and the cluster balances with RING_HASH."""
    doc = yaml.safe_load(ENVOY_YAML.read_text())
    boot = _bootstrap(doc)
    (listener,) = boot.static_resources.listeners
    hcm = http_connection_manager_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    (route,) = hcm.route_config.virtual_hosts[0].routes
    first, second = route.route.hash_policy
    assert first.header.header_name == "x-session-id" and first.terminal
    assert second.header.header_name == "x-request-id"
    (cluster,) = boot.static_resources.clusters
    assert route.route.cluster == cluster.name
    assert cluster.lb_policy == cluster_pb2.Cluster.RING_HASH
    assert cluster.health_checks[0].http_health_check.path == "/readyz"


def test_a_broken_envoy_config_fails_the_check() -> None:
    """The check has teeth: a misspelt field and an unknown lb_policy each fail it."""
    doc = yaml.safe_load(ENVOY_YAML.read_text())
    misspelt = copy.deepcopy(doc)
    misspelt["static_resources"]["clusters"][0]["ring_hash_config"] = {}
    unknown = copy.deepcopy(doc)
    unknown["static_resources"]["clusters"][0]["lb_policy"] = "SESSION_HASH"
    for broken in (misspelt, unknown):
        with pytest.raises(json_format.ParseError):
            _bootstrap(broken)
