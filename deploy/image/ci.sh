#!/usr/bin/env bash
# The image step of .ci/run: build the Containerfile on a local Debian base (no image registry is
# reachable where CI runs: deploy/image/base.sh) and run it the way a pod does.
#
#   1. podman build, with pip's index settings and CA bundle from this machine's pip config;
#   2. the image's size against a cap;
#   3. `canary demo` as UID 10001 over the image's root-owned files, where the only place
#      UID 10001 can write is /tmp (checked first): it must exit 0 with every candidate decided;
#   4. deploy/k8s's own commands, from the image: the db-upgrade Job's args migrate a SQLite
#      file, then the Deployment's args, with its ConfigMap file at /etc/canary, serve as PID 1
#      of a PID namespace (`unshare --pid --fork`) and are stopped by SIGTERM mid-stream
#      (deploy/image/pod_check.py).
#
# Runs are `buildah run --isolation=chroot`: podman's OCI runtime cannot start here.
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=.venv/bin/python

# 480 MiB: the measured image (428 MiB) (docs/operating.md, "The image") plus a margin; a dependency that
# grows it past this is a decision, not an accident.
SIZE_CAP_BYTES=$((480 * 1024 * 1024))

for tool in podman buildah debootstrap; do
  if ! command -v "$tool" >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap >/dev/null
    break
  fi
done

# The step's logs go under .image-cache/ (git-ignored); base.sh makes it only when it builds the
# base, and a machine whose podman storage already holds the base skips that.
mkdir -p .image-cache
base=$(bash deploy/image/base.sh)
version=$("$python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image=localhost/canary-gateway:$version
echo "base $base; building $image ($((SECONDS - started)) s)"

# pip inside the build reads the index this machine's pip reads (PyPI unless configured) and
# trusts the CA bundle it trusts (TLS may be intercepted on the way to the index). The local
# file:// indexes and find-links of this machine's config are not in the build's reach.
build_args=(--build-arg "BASE=$base" --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || true)")
index=$(pip config get global.index-url 2>/dev/null || true)
case "$index" in http*) build_args+=(--build-arg "PIP_INDEX=$index") ;; esac
cert=${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}
[ -s "$cert" ] || cert=/etc/ssl/certs/ca-certificates.crt
[ -s "$cert" ] && build_args+=(--secret "id=pip-cert,src=$cert")
podman build --isolation=chroot --layers "${build_args[@]}" -t "$image" -f Containerfile . \
  >.image-cache/build.log 2>&1 || { tail -n 60 .image-cache/build.log; exit 1; }
echo "built in $((SECONDS - started)) s"

size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image size: $((size / 1024 / 1024)) MiB ($size bytes; cap $((SIZE_CAP_BYTES / 1024 / 1024)) MiB)"
if [ "$size" -gt "$SIZE_CAP_BYTES" ]; then
  echo "the image is over its size cap" >&2
  exit 1
fi

ctr=$(buildah from --pull-never "$image")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
run() { buildah run --isolation=chroot "$@"; }

# Where UID 10001 may write: only the temporary directories (the pod mounts /tmp; its root is
# read-only). Every file of the image is root's.
writable=$(run --user 10001:10001 "$ctr" -- find / -xdev \( -path /proc -o -path /sys \
  -o -path /dev \) -prune -o -writable -print 2>/dev/null | grep -vE '^/(tmp|var/tmp|run/lock|var/lock)(/|$)' || true)
if [ -n "$writable" ]; then
  echo "UID 10001 can write outside /tmp in the image:" >&2
  echo "$writable" >&2
  exit 1
fi
not_root=$(run --user 0:0 "$ctr" -- find /opt/canary ! -user 0 -print | head -n 5)
[ -z "$not_root" ] || { echo "image files not owned by root: $not_root" >&2; exit 1; }
echo "ok: UID 10001 writes only under /tmp; /opt/canary is root's"

demo_log=.image-cache/demo.log
run --user 10001:10001 --workingdir /tmp "$ctr" -- canary demo --out-dir /tmp/canary-reports \
  >"$demo_log" 2>&1 || { tail -n 60 "$demo_log"; echo "canary demo failed in the image" >&2; exit 1; }
for line in "bi-kv (bi-kv): PROMOTE" "quantized (quantized): REJECT" \
    "upgrade (model-upgrade): PROMOTE, decided by preference" "every candidate decided after"; do
  grep -qF "$line" "$demo_log" || { tail -n 40 "$demo_log"; echo "the image's demo did not print: $line" >&2; exit 1; }
done
echo "ok: canary demo as UID 10001 in the image: every candidate decided ($((SECONDS - started)) s)"

# Each manifest's own args, after the image's entrypoint (`canary`), and the pod's grace.
read -r job_args pod_args grace < <("$python" - <<'PY'
import json, yaml
def spec(name):
    return yaml.safe_load(open(f"deploy/k8s/{name}"))["spec"]["template"]["spec"]
job, pod = spec("job-db-upgrade.yaml"), spec("deployment.yaml")
print(json.dumps(job["containers"][0]["args"], separators=(",", ":")),
      json.dumps(pod["containers"][0]["args"], separators=(",", ":")),
      pod["terminationGracePeriodSeconds"])
PY
)
entrypoint=$(podman image inspect --format '{{json .Config.Entrypoint}}' "$image")
[ "$entrypoint" = '["canary"]' ] || { echo "the image's entrypoint is $entrypoint" >&2; exit 1; }
run --user 0:0 --cap-add CAP_SYS_ADMIN --cap-add CAP_SYS_PTRACE \
  --volume "$PWD/deploy/k8s/gateway.toml:/etc/canary/gateway.toml:ro" \
  --volume "$PWD/deploy/image/pod_check.py:/check/pod_check.py:ro" \
  "$ctr" -- python3 /check/pod_check.py "$job_args" "$pod_args" "$grace"
echo "image step done in $((SECONDS - started)) s"
