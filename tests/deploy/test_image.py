"""The container image's recipe and the manifests that run it agree, checked without a builder:
the Containerfile's shape (two stages from one `BASE`, the venv at one path, UID 10001, no
package cache), its version label against pyproject.toml, what `.containerignore` keeps out of
the context, the one command convention (the entrypoint is `canary`, a manifest's args are a
subcommand the CLI parses), and the volumes the gateway writes to in a pod.

deploy/image/ci.sh (run by .ci/run) builds the image and runs each manifest's command in it."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli.main import build_parser
from gateway.config.load import load_config

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
K8S = ROOT / "deploy" / "k8s"
VENV = "/opt/canary"


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, args))
    return stages


def _labels() -> dict[str, str]:
    labels: dict[str, str] = {}
    for keyword, args in _stages()[-1]:
        if keyword == "LABEL":
            labels |= dict(re.findall(r'([\w.\-]+)="([^"]*)"', args))
    return labels


def _entrypoint() -> list[str]:
    entry = [json.loads(args) for keyword, args in _stages()[-1] if keyword == "ENTRYPOINT"]
    assert len(entry) == 1, "the runtime stage states one ENTRYPOINT, in exec form"
    value: list[str] = entry[0]
    return value


def _containers() -> list[dict[str, Any]]:
    """Every container of every workload in the kustomize base."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    found = []
    for name in kustomization["resources"]:
        for obj in yaml.safe_load_all((K8S / name).read_text()):
            if obj and obj["kind"] in ("Deployment", "Job"):
                found.extend(obj["spec"]["template"]["spec"]["containers"])
    return found


def _pod(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_the_version_label_is_the_projects() -> None:
    """The image's version label equals pyproject.toml's version, and it names its source and
    licence (the project's licence expression)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    labels = _labels()
    assert labels["org.opencontainers.image.version"] == project["version"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.source"] == "${SOURCE}"


def test_the_containerfile_is_two_stages_from_one_slim_base() -> None:
    """Both stages start from the `BASE` argument (python:3.11-slim-bookworm by default), the
    runtime stage copies only the builder's venv to the same path, installs nothing, runs as
    UID 10001, and pip keeps no cache in the builder."""
    instructions = _instructions()
    assert ("ARG", "BASE=python:3.11-slim-bookworm") in instructions
    builder, runtime = _stages()
    assert builder[0] == ("FROM", "${BASE} AS builder")
    assert runtime[0] == ("FROM", "${BASE}")
    assert ("RUN", f"python3 -m venv {VENV}") in builder
    assert any(k == "ENV" and "PIP_NO_CACHE_DIR=1" in a for k, a in builder)
    copies = [args for keyword, args in runtime if keyword in ("COPY", "ADD")]
    assert copies == [f"--from=builder {VENV} {VENV}"]
    assert not [args for keyword, args in runtime if keyword == "RUN"]
    assert ("USER", "10001:10001") in runtime
    assert any(k == "ENV" and f"PATH={VENV}/bin:" in a for k, a in runtime)


def test_the_containerignore_keeps_the_context_small() -> None:
    """.containerignore keeps git, virtualenvs, the real-engine kit, the image cache and the
    bench's outputs out of the build context."""
    ignored = {
        line.strip()
        for line in (ROOT / ".containerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".real-engine", ".image-cache", "bench", "canary-reports"} <= ignored
    copied = [args.split()[0] for keyword, args in _stages()[0] if keyword == "COPY"]
    assert not any(path.lstrip("/") in ignored for path in copied), copied


def test_every_manifest_command_is_a_canary_subcommand() -> None:
    """The entrypoint is `canary`; every container of deploy/k8s leaves `command` to it and
    passes args the CLI parses as a subcommand (so `canary canary serve` cannot slip in)."""
    assert _entrypoint() == ["canary"]
    containers = _containers()
    assert {c["name"] for c in containers} == {"gateway", "db-upgrade"}
    parser = build_parser()
    for container in containers:
        assert "command" not in container, container["name"]
        args = container["args"]
        assert args[0] != "canary", container["name"]
        parsed = parser.parse_args(args)
        assert callable(parsed.func), container["name"]


def test_a_doubled_program_name_does_not_parse() -> None:
    """The check above has teeth: `canary` repeated in front of the subcommand is refused."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["canary", "serve", "--config", "/etc/canary/gateway.toml"])


def _size_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert match, quantity
    return int(match[1]) * units[match[2]]


def test_what_the_gateway_writes_has_a_volume_of_its_size() -> None:
    """reports.spill_dir (gateway.toml) is a disk emptyDir mounted in the gateway's container,
    large enough for reports.max_pairs' spill file (2.3 GB at 10 M pairs, ~230 bytes a pair);
    /dev/shm is a memory emptyDir larger than the session -> arm table (8 bytes a slot)."""
    config = load_config(str(K8S / "gateway.toml"), environ={})
    pod = _pod("deployment.yaml")
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}

    spill = mounts[config.reports.spill_dir]["emptyDir"]
    assert spill.get("medium", "") == ""  # the node's disk: tmpfs pages would be memory
    assert _size_bytes(spill["sizeLimit"]) >= config.reports.max_pairs * 230
    assert config.reports.spill_dir != "/tmp"

    shm = mounts["/dev/shm"]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert _size_bytes(shm["sizeLimit"]) >= 2 * config.rollout.arms_slots * 8
    assert config.rollout.arms_dir in ("", "/dev/shm")
