"""deploy/k8s: the kustomize base renders, every object is valid against the Kubernetes API
schemas (those bundled by `kubernetes-validate`, strict: unknown fields are errors), and the pod
it describes runs: its config file, its environment, its probes, its ports and the Job's
command, on a real `canary serve`.

`kubectl kustomize` renders the base when kubectl is installed (every machine this project's CI
runs on has it; `.ci/run` sets CANARY_REQUIRE_KUBECTL=1 so its absence fails there); without it
the render test skips and the files are validated one by one."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError

from gateway.config.load import load_config, settings_variables
from tests.fixtures_net import Served
from tests.upstreams import free_port, scripted_app
from tests.waiting import SERVE_START_S, until, until_ready

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s"
# The oldest Kubernetes release still maintained when the base was written, and the newest
# schemas the package bundles.
VERSIONS = ["1.32.0", kubernetes_validate.latest_version()]


def _resources() -> list[Path]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [BASE / name for name in kustomization["resources"]]


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CANARY_REQUIRE_KUBECTL") == "1":
            pytest.fail("CANARY_REQUIRE_KUBECTL=1 but kubectl is not installed", pytrace=False)
        pytest.skip("kubectl is not installed: the base is not rendered here")
    out = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, check=True, timeout=60
    )
    return _objects(out.stdout)


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    return kinds


@pytest.mark.parametrize("version", VERSIONS)
def test_each_file_is_a_valid_kubernetes_object(version: str) -> None:
    """Every resource file of the base validates strictly against that release's schemas."""
    for path in _resources():
        for obj in _objects(path.read_text()):
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_base_is_valid_and_complete(version: str) -> None:
    """`kubectl kustomize deploy/k8s` renders every object the issue asks for, each valid."""
    objects = _rendered()
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    kinds = _by_kind(objects)
    assert {k: len(v) for k, v in kinds.items()} == {
        "ConfigMap": 1,
        "Deployment": 1,
        "Service": 2,
        "NetworkPolicy": 1,
        "PodDisruptionBudget": 1,
        "Job": 1,
        "Ingress": 1,
    }
    pod = kinds["Deployment"][0]["spec"]["template"]["spec"]
    config_map = kinds["ConfigMap"][0]["metadata"]["name"]
    assert pod["volumes"][0]["configMap"]["name"] == config_map  # the generated, hashed name


def test_a_broken_object_fails_the_validation() -> None:
    """The check has teeth: a misspelt field, a wrong type and a missing required field each
    fail it."""
    deployment = _objects((BASE / "deployment.yaml").read_text())[0]
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["replica"] = 3
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "three"
    missing = copy.deepcopy(deployment)
    del missing["spec"]["template"]["spec"]["containers"][0]["name"]
    for broken in (misspelt, wrong_type, missing):
        with pytest.raises(ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def _load(name: str) -> dict[str, Any]:
    objects: list[dict[str, Any]] = _objects((BASE / name).read_text())
    return objects[0]


def test_admin_port_is_internal_and_probes_are_the_gateways() -> None:
    """The proxy Service and the ingress expose only the proxy port; the admin port has its own
    ClusterIP Service and only labelled pods may reach it; probes use /readyz and /healthz;
    the secrets and the replica name reach the process as the variables it reads."""
    deployment = _load("deployment.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = load_config(str(BASE / "gateway.toml"), environ={})
    assert config.server.listen.endswith(f":{ports['proxy']}")
    assert config.admin.listen is not None and config.admin.listen.endswith(f":{ports['admin']}")

    proxy, admin = _load("service.yaml"), _load("service-admin.yaml")
    assert [p["targetPort"] for p in proxy["spec"]["ports"]] == ["proxy"]
    assert proxy["spec"]["type"] == admin["spec"]["type"] == "ClusterIP"
    assert [p["targetPort"] for p in admin["spec"]["ports"]] == ["admin"]
    ingress = _load("ingress.yaml")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "canary-gateway", "port": {"name": "http"}}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"] == (
        "$http_x_session_id"
    )
    policy = _load("networkpolicy.yaml")["spec"]
    rules = {rule["ports"][0]["port"]: rule for rule in policy["ingress"]}
    assert "from" not in rules["proxy"]
    assert rules["admin"]["from"] == [
        {"podSelector": {"matchLabels": {"canary-gateway/admin-client": "true"}}}
    ]

    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "proxy"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "proxy"}
    env = {e["name"] for e in container["env"]}
    assert env == {"CANARY_STORAGE_DB_URL", "CANARY_ADMIN_TOKEN", "CANARY_SERVER_REPLICA_NAME"}
    assert env <= settings_variables()
    pdb = _load("pdb.yaml")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert proxy["spec"]["selector"] == admin["spec"]["selector"] == selector
    assert policy["podSelector"]["matchLabels"] == selector
    assert deployment["spec"]["template"]["metadata"]["labels"] == selector


async def _run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_the_pod_runs_as_described(serve: Any, tmp_path: Path) -> None:
    """The Job's command migrates the database named by CANARY_STORAGE_DB_URL; then the Deployment's
    command with the ConfigMap's file and the Deployment's variables serves: the probes answer
    200 on the proxy port, the admin API answers on the admin port with the token, and the
    workers log the pod's name as their replica."""
    live: Served = await serve(scripted_app())
    job = _load("job-db-upgrade.yaml")["spec"]["template"]["spec"]["containers"][0]
    pod = _load("deployment.yaml")["spec"]["template"]["spec"]["containers"][0]
    proxy_port, admin_port = free_port(), free_port()
    token = "ops:" + "k" * 32
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env |= {
        "CANARY_STORAGE_DB_URL": f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}",
        "CANARY_ADMIN_TOKEN": token,
        "CANARY_SERVER_REPLICA_NAME": "canary-gateway-7d9f-abcde",
        # Where the pod has its own network namespace, the test shares 127.0.0.1.
        "CANARY_LISTEN": f"127.0.0.1:{proxy_port}",
        "CANARY_ADMIN_LISTEN": f"127.0.0.1:{admin_port}",
        "CANARY_LIVE_URL": live.url,
    }
    # The image's entrypoint, `canary` (tests/deploy/test_image.py), as this checkout's module;
    # the spill volume's path is the pod's, a temporary directory here.
    python = [sys.executable, "-m", "gateway.cli.main"]
    env["CANARY_REPORTS_SPILL_DIR"] = str(tmp_path)
    code, out = await _run(*python, *job["args"], env=env)
    assert code == 0, out
    config = pod["args"][pod["args"].index("--config") + 1]
    args = [a if a != config else str(BASE / "gateway.toml") for a in pod["args"]]
    proc = await asyncio.create_subprocess_exec(
        *python, *args, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    base = f"http://127.0.0.1:{proxy_port}"
    try:
        async with aiohttp.ClientSession() as http:
            for probe in ("readinessProbe", "livenessProbe"):
                # Two workers and the mirror process: the start the product bounds.
                await until_ready(base + pod[probe]["httpGet"]["path"], proc)
            # A probe is answered by whichever worker listens first: wait for both before the
            # pod is stopped (one still starting is stopped cleanly, but logs nothing to read).
            pids: set[int] = set()
            # A connection per request: the kernel spreads connections, not requests.
            fresh = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=fresh) as one_shot:

                async def both() -> bool:
                    async with one_shot.get(base + "/healthz") as resp:
                        pids.add((await resp.json())["pid"])
                    return len(pids) == 2

                with contextlib.suppress(AssertionError):  # the assertion below says who
                    await until(both, what="both workers answering", within_s=SERVE_START_S)
            assert len(pids) == 2, pids
            admin = f"http://127.0.0.1:{admin_port}/admin/status"
            async with http.get(admin) as resp:
                assert resp.status == 401
            headers = {"Authorization": f"Bearer {token.split(':', 1)[1]}"}
            async with http.get(admin, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = await asyncio.wait_for(proc.stderr.read(), 60)
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0, err.decode()[-2000:]
    listening = [
        json.loads(line) for line in err.decode().splitlines() if "canary-gateway listening" in line
    ]
    assert len(listening) == 2  # the ConfigMap's two workers, each under the pod's name
    assert all(r["replica"].startswith("canary-gateway-7d9f-abcde-") for r in listening), listening
