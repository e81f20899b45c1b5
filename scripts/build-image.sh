#!/usr/bin/env bash
# Builds tandem's OCI image, one for every role (`serve --role all|api|trainer`), from Debian's
# packages alone, with no container registry and no container engine: `make image`.
#
#   scripts/build-image.sh [BINARY] [MODEL]
#
# BINARY defaults to target/release/tandem (`make build`), MODEL to the bundled SmolLM2 GGUF.
# The result, in target/image/:
#   oci/            an OCI image layout, tags `latest` and the workspace's version (e.g. `0.1.0`)
#   tandem-oci.tar  the same layout as an oci-archive (`podman load -i`, `skopeo copy oci-archive:`)
#
# Two layers:
#   1. Debian bookworm's Essential packages plus ca-certificates and curl (curl for health checks
#      such as the Dockerfile's), made by mmdebstrap from the apt sources this machine is already
#      configured with, without documentation, apt lists or caches; the user `tandem` (uid and gid
#      10001, home /data) and the directories /data (owned by it) and /models. It is cached as
#      target/image/rootfs-<hash of its recipe>.tar and made again only when the recipe changes.
#   2. /usr/local/bin/tandem and /models/SmolLM2-135M-Instruct.Q4_1.gguf.
# The image config has the Dockerfile's settings: user 10001:10001 (tandem), TANDEM_HOST=0.0.0.0,
# TANDEM_PORT=8000, TANDEM_DATA_DIR=/data, TANDEM_MODEL=/models/..., entrypoint `tandem`, command
# `serve`, volume /data, port 8000/tcp and org.opencontainers.image.* labels. An OCI config has no
# health check (HEALTHCHECK is Docker's own): Kubernetes probes /health itself (deploy/k8s), and
# under Docker or Podman pass `--health-cmd 'curl -fsS http://127.0.0.1:8000/health'`.
#
# Needs root (mmdebstrap's root mode writes files owned by other users), mmdebstrap and umoci
# (Debian's packages; `make image` installs them when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

BINARY=${1:-target/release/tandem}
MODEL=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=target/image
SUITE=bookworm
PACKAGES=ca-certificates,curl
TANDEM_UID=10001
MODEL_IN_IMAGE=/models/$(basename "$MODEL")

started=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
    "$started" "$(date +%s.%N)"; }

for tool in mmdebstrap umoci python3; do
    command -v "$tool" >/dev/null ||
        { echo "error: $tool is missing (apt-get install -y mmdebstrap umoci)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "error: building the image needs root (mmdebstrap's root mode)" >&2; exit 1; }
[ -x "$BINARY" ] || { echo "error: no binary at $BINARY (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "error: no model at $MODEL (make model)" >&2; exit 1; }
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
mkdir -p "$OUT"

# The apt sources this machine uses for $SUITE (and its -updates and -security suites), as
# one-line entries for mmdebstrap: read from /etc/apt/sources.list and sources.list.d (both the
# one-line and the deb822 format), so the image comes from the same mirror as the host's packages.
mapfile -t SOURCES < <(python3 - "$SUITE" <<'EOF'
import glob, re, sys
suite = sys.argv[1]
out = []
def add(uri, suites, components):
    for s in suites:
        if s == suite or s.startswith(suite + "-") or s.startswith(suite + "/"):
            line = f"deb {uri} {s} {' '.join(components) or 'main'}"
            if line not in out:
                out.append(line)
paths = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
for path in paths:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        line = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
        if len(line) >= 3 and line[0] == "deb":
            add(line[1], [line[2]], line[3:])
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            add(uri, fields.get("suites", "").split(), fields.get("components", "").split())
print("\n".join(out))
EOF
)
[ ${#SOURCES[@]} -gt 0 ] && [ -n "${SOURCES[0]}" ] || {
    echo "error: no apt source for $SUITE in /etc/apt/sources.list or /etc/apt/sources.list.d" >&2; exit 1; }

# Layer 1: the root filesystem, made in a directory and then written as a tar file without device
# nodes (the runtime makes /dev; nodes in a layer need privileges to unpack), logs and caches.
# finish_rootfs is part of the recipe (its text is in the cache key).
finish_rootfs() {
    local root=$1
    rm -rf "$root"/var/log/* "$root"/var/cache/debconf/*-old "$root"/var/cache/ldconfig/aux-cache \
        "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/tmp/* "$root"/dev/*
    echo "tandem:x:$TANDEM_UID:$TANDEM_UID:tandem:/data:/usr/sbin/nologin" >> "$root/etc/passwd"
    echo "tandem:x:$TANDEM_UID:" >> "$root/etc/group"
    echo "tandem:*:19000:0:99999:7:::" >> "$root/etc/shadow"
    echo "tandem:*::" >> "$root/etc/gshadow"
    mkdir -p "$root/data" "$root/models"
    chown "$TANDEM_UID:$TANDEM_UID" "$root/data"
    chmod 0750 "$root/data"
}
MMDEBSTRAP_ARGS=(
    --variant=essential --include="$PACKAGES" --aptopt='APT::Install-Recommends "false"'
    # merged /usr the way debootstrap makes it, with usr-is-merged instead of usrmerge and its Perl
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
)
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
ROOTFS_KEY=$(printf '%s\n' "$SUITE" "$TANDEM_UID" "${MMDEBSTRAP_ARGS[@]}" "${SOURCES[@]}" \
    "$(declare -f finish_rootfs)" | sha256sum | cut -c1-16)
ROOTFS=$OUT/rootfs-$ROOTFS_KEY.tar
if [ -f "$ROOTFS" ]; then
    echo "root filesystem: cached $ROOTFS"
else
    echo "root filesystem: mmdebstrap $SUITE ($PACKAGES) from ${#SOURCES[@]} apt source(s) of this machine"
    rm -rf "$OUT"/rootfs-*.tar "$OUT/rootfs.tmp" "$OUT/rootfs.tmp.tar"
    # SOURCE_DATE_EPOCH: the same recipe and package versions give the same files.
    SOURCE_DATE_EPOCH=$EPOCH mmdebstrap "${MMDEBSTRAP_ARGS[@]}" "$SUITE" "$OUT/rootfs.tmp" "${SOURCES[@]}" \
        > "$OUT/mmdebstrap.log" 2>&1 || {
        tail -n 40 "$OUT/mmdebstrap.log" >&2
        echo "error: mmdebstrap failed (log: $OUT/mmdebstrap.log)" >&2
        exit 1
    }
    finish_rootfs "$OUT/rootfs.tmp"
    tar -cf "$OUT/rootfs.tmp.tar" -C "$OUT/rootfs.tmp" --sort=name --numeric-owner --xattrs \
        --mtime=@"$EPOCH" --clamp-mtime .
    rm -rf "$OUT/rootfs.tmp"
    mv "$OUT/rootfs.tmp.tar" "$ROOTFS"
fi

# Every shared library the binary needs must be in the root filesystem.
missing=()
files=$(tar -tf "$ROOTFS" | sed 's,.*/,,' | sort -u)
for lib in $(ldd "$BINARY" | awk '$2 == "=>" {print $1} $1 ~ /^\// {print $1}'); do
    grep -qxF "$(basename "$lib")" <<<"$files" || missing+=("$lib")
done
[ ${#missing[@]} = 0 ] || { echo "error: the root filesystem lacks ${missing[*]} (needed by $BINARY)" >&2; exit 1; }

# Nothing to do when neither layer nor this script changed since the last build.
STAMP=$(printf '%s\n' "$ROOTFS_KEY" "$VERSION" "$REVISION" "$MODEL_IN_IMAGE" \
    "$(sha256sum "$BINARY" "$MODEL" "$0" | cut -c1-64)" | sha256sum | cut -c1-64)
if [ -f "$OUT/oci/index.json" ] && [ -f "$OUT/tandem-oci.tar" ] &&
    [ "$(cat "$OUT/oci.stamp" 2>/dev/null)" = "$STAMP" ]; then
    echo "image: up to date ($OUT/oci)"
else
    # Layer 2: the binary and the model (hard links where they can be: no 200 MB copy).
    APP=$OUT/app
    rm -rf "$APP" "$OUT/app.tar" "$OUT/oci.tmp"
    mkdir -p "$APP/usr/local/bin" "$APP/models"
    ln -f "$BINARY" "$APP/usr/local/bin/tandem" 2>/dev/null || cp "$BINARY" "$APP/usr/local/bin/tandem"
    ln -f "$MODEL" "$APP$MODEL_IN_IMAGE" 2>/dev/null || cp "$MODEL" "$APP$MODEL_IN_IMAGE"
    tar -cf "$OUT/app.tar" -C "$APP" --sort=name --numeric-owner --owner=0 --group=0 --mode=go-w \
        --mtime=@"$EPOCH" ./usr/local/bin/tandem ".$MODEL_IN_IMAGE"

    IMAGE=$OUT/oci.tmp
    umoci init --layout "$IMAGE"
    umoci new --image "$IMAGE:latest"
    umoci raw add-layer --image "$IMAGE:latest" --history.author tandem \
        --history.created_by "mmdebstrap --variant=essential --include=$PACKAGES $SUITE (scripts/build-image.sh)" \
        "$ROOTFS"
    umoci raw add-layer --image "$IMAGE:latest" --history.author tandem \
        --history.created_by "/usr/local/bin/tandem and $MODEL_IN_IMAGE (scripts/build-image.sh)" "$OUT/app.tar"
    umoci config --image "$IMAGE:latest" --no-history --os linux --architecture "$(dpkg --print-architecture)" \
        --author tandem --config.user "$TANDEM_UID:$TANDEM_UID" \
        --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.env TANDEM_HOST=0.0.0.0 --config.env TANDEM_PORT=8000 --config.env TANDEM_DATA_DIR=/data \
        --config.env TANDEM_MODEL="$MODEL_IN_IMAGE" \
        --config.entrypoint tandem --config.cmd serve --config.volume /data --config.exposedports 8000/tcp \
        --config.label org.opencontainers.image.title=tandem \
        --config.label "org.opencontainers.image.description=OpenAI-compatible LLM server and RL trainer \
(every role: serve --role all|api|trainer)" \
        --config.label org.opencontainers.image.version="$VERSION" \
        --config.label org.opencontainers.image.revision="$REVISION" \
        --config.label org.opencontainers.image.licenses=Apache-2.0 \
        --config.label org.opencontainers.image.created="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        --config.label org.opencontainers.image.base.name="debian:$SUITE (mmdebstrap, essential)"
    umoci tag --image "$IMAGE:latest" "$VERSION"
    umoci gc --layout "$IMAGE"
    rm -rf "$OUT/oci" "$APP" "$OUT/app.tar"
    mv "$IMAGE" "$OUT/oci"
    # An oci-archive is the layout as a tar file.
    tar -cf "$OUT/tandem-oci.tar.tmp" -C "$OUT/oci" --sort=name .
    mv "$OUT/tandem-oci.tar.tmp" "$OUT/tandem-oci.tar"
    echo "$STAMP" > "$OUT/oci.stamp"
fi

# Sizes: each layer compressed (what a registry stores and a pull transfers) and uncompressed.
python3 - "$OUT/oci" <<'EOF'
import gzip, json, os, sys
layout = sys.argv[1]
def blob(digest):
    return os.path.join(layout, "blobs", *digest.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
tags = sorted(m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"])
manifest = json.load(open(blob(next(m["digest"] for m in index["manifests"]
                                    if m["annotations"]["org.opencontainers.image.ref.name"] == "latest"))))
total_c = total_u = 0
for i, layer in enumerate(manifest["layers"], 1):
    size_u = 0
    with gzip.open(blob(layer["digest"])) as f:
        while chunk := f.read(1 << 20):
            size_u += len(chunk)
    total_c += layer["size"]
    total_u += size_u
    print(f"layer {i}: {layer['size'] / 1e6:.1f} MB compressed, {size_u / 1e6:.1f} MB uncompressed "
          f"({layer['digest'][:19]})")
print(f"image: {total_c / 1e6:.1f} MB compressed, {total_u / 1e6:.1f} MB uncompressed; tags {', '.join(tags)}")
EOF
echo "archive: $OUT/tandem-oci.tar ($(du -m "$OUT/tandem-oci.tar" | cut -f1) MB)"
echo "build time: $(elapsed) s"
