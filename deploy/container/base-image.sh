#!/bin/sh
# A base image from Debian packages alone (no registry needed): bookworm's python3 and its
# venv module, made with mmdebstrap and imported into podman (or docker) as
# localhost/debian-python:bookworm. Needs root (or a working unshare), mmdebstrap and a
# Debian mirror; about 2 minutes.
set -eu
TOOL=${CONTAINER_TOOL:-podman}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TAR=${TMPDIR:-/tmp}/debian-python-$$.tar
trap 'rm -f "$TAR"' EXIT
mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$TAR" "$MIRROR"
"$TOOL" import --change 'CMD ["/bin/bash"]' "$TAR" localhost/debian-python:bookworm
