#!/usr/bin/env bash
# Builds the local base image CI builds the Containerfile on, where no image registry is
# reachable: Debian bookworm's minimal root (debootstrap --variant=minbase) with python3 and
# python3-venv, imported into podman as `localhost/canary-base:<key>`. The key hashes every input
# (suite, variant, packages, mirror, architecture, this file), and the root's tarball is kept
# under .image-cache/ (git-ignored), so a rerun on the same machine imports it in seconds.
# Prints the image's name on stdout; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."

suite=bookworm
variant=minbase
packages=python3,python3-venv
mirror=${CANARY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
arch=$(dpkg --print-architecture)
key=$(printf '%s\n' "$suite" "$variant" "$packages" "$mirror" "$arch" "$(sha256sum "$0")" \
  | sha256sum | cut -c1-16)
cache=.image-cache
tarball=$cache/base-$suite-$key.tar
image=localhost/canary-base:$key

if podman image exists "$image"; then
  echo "$image"
  exit 0
fi
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  echo "debootstrap $suite ($variant, $packages) from $mirror" >&2
  root=$(realpath "$(mktemp -d "$cache/root.XXXXXX")")
  # debootstrap mounts /proc (and more) inside the root and may leave them mounted: unmount
  # whatever is under it before removing it or packing it.
  unmount_all() {
    findmnt -rn -o TARGET | { grep "^$root/" || true; } | sort -r | while read -r m; do umount -l "$m"; done
  }
  trap 'unmount_all; rm -rf "$root"' EXIT
  debootstrap --variant="$variant" --include="$packages" "$suite" "$root" "$mirror" >&2
  unmount_all
  # What a slim base leaves out: package lists, the package cache, documentation, logs.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
    "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/debconf/*-old "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/usr/share/lintian
  tar -C "$root" --numeric-owner --one-file-system -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi
podman import --change 'CMD ["python3"]' "$tarball" "$image" >&2
echo "$image"
