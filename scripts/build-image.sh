#!/usr/bin/env bash
# Builds the gpuscale container image (controller and node agent in one) without pulling anything:
# the release binary, a minimal root file system from Debian packages (scripts/image-rootfs.sh),
# packed by Debian's umoci into an OCI layout, then exported with skopeo as a docker-archive for
# `docker load` and `kind load image-archive`. Reproducible: the same commit, binary and Debian
# package versions give the same image digest (fixed timestamps from SOURCE_DATE_EPOCH, sorted
# layer entries, numeric owners, no build-time data). See docs/image.md.
#
#   scripts/build-image.sh                  # builds target/image/ (needs: apt-get install umoci skopeo)
#   scripts/build-image.sh --out DIR        # another output folder
#   scripts/build-image.sh --binary FILE    # use this gpuscale binary instead of running cargo
#   scripts/build-image.sh --print-config   # the image's config (user, entrypoint, env, labels...)
#
# Output (in --out, default ${CARGO_TARGET_DIR:-target}/image):
#   oci/                                    OCI image layout, tag <version> (Cargo.toml's version)
#   gpuscale-<version>-<arch>.docker.tar    docker-archive named ghcr.io/gpuscale/gpuscale:<version>
#   packages.txt                            the Debian packages in the image: version, .deb sha256
#   digest                                  the image manifest's digest
#
# Environment:
#   SOURCE_DATE_EPOCH    image and file timestamps (default: the commit time of HEAD)
#   IMAGE_REPOSITORY     the docker-archive's image name (default: the chart's, below)
#   GPUSCALE_DEB_CACHE   the .deb cache of scripts/image-rootfs.sh
set -euo pipefail
umask 022
export LC_ALL=C
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# --out and --binary are relative to where the script is called from; the rest works in the checkout.
called_from="$PWD"
cd "$repo"

# The image's definition. The Dockerfile states the same (tests/image_definition.rs checks it) and
# charts/gpuscale/values.yaml names the same repository.
REPOSITORY="${IMAGE_REPOSITORY:-ghcr.io/gpuscale/gpuscale}"
# Default features plus the cloud providers: a controller image must reach AWS and GCP.
FEATURES="aws,gcp"
# Cargo.toml's release profile without debug info (see there).
PROFILE="container"
IMAGE_USER="65532:65532"
WORKDIR="/home/nonroot"
ENTRYPOINT="/usr/bin/gpuscale"
ENVIRONMENT=(
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
)

die() {
    echo "build-image.sh: $*" >&2
    exit 1
}

out="${CARGO_TARGET_DIR:-target}/image"
binary=""
print_config=false
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$(cd "$called_from" && realpath -m "${2:?--out needs a folder}")"; shift 2 ;;
        --binary) binary="$(cd "$called_from" && realpath -m "${2:?--binary needs a file}")"; shift 2 ;;
        --print-config) print_config=true; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

# A field of Cargo.toml's [package] table.
package_field() {
    sed -n '/^\[package\]/,/^\[/{s/^'"$1"' = "\(.*\)"$/\1/p}' Cargo.toml | head -n1
}
version="$(package_field version)"
[[ -n "$version" ]] || die "no version in Cargo.toml"
revision="$(git rev-parse HEAD 2>/dev/null)" || die "not in a git checkout (the revision label needs it)"
[[ -z "$(git status --porcelain 2>/dev/null)" ]] || revision="$revision-dirty"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
# The image is for this machine's architecture (Debian's name); --print-config also works where
# there is no dpkg.
arch="$(dpkg --print-architecture 2>/dev/null)" || case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) arch="$(uname -m)" ;;
esac
LABELS=(
    "org.opencontainers.image.title=gpuscale"
    "org.opencontainers.image.description=$(package_field description)"
    "org.opencontainers.image.source=$(package_field repository)"
    "org.opencontainers.image.licenses=$(package_field license)"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.created=$created"
)

if $print_config; then
    echo "repository $REPOSITORY"
    echo "tag $version"
    echo "architecture $arch"
    echo "features $FEATURES"
    echo "profile $PROFILE"
    echo "user $IMAGE_USER"
    echo "workdir $WORKDIR"
    echo "entrypoint $ENTRYPOINT"
    printf 'env %s\n' "${ENVIRONMENT[@]}"
    printf 'label %s\n' "${LABELS[@]}"
    exit 0
fi

for tool in umoci skopeo dpkg-deb apt-get tar; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install umoci skopeo)"
done

if [[ -z "$binary" ]]; then
    # Build paths end up in the binary (panic locations of dependencies, generated code): map them
    # to fixed names so that the binary does not depend on where the checkout, the cargo home and
    # the target folder are. Only this profile's folder is built with these flags, so no other
    # build is made stale by them.
    target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"
    flags=()
    [[ -z "${RUSTFLAGS:-}" ]] || read -ra flags <<<"$RUSTFLAGS"
    flags+=(
        "--remap-path-prefix=$repo=/gpuscale"
        "--remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
        "--remap-path-prefix=$target_dir=/target"
    )
    CARGO_ENCODED_RUSTFLAGS="$(IFS=$'\x1f'; echo "${flags[*]}")"
    export CARGO_ENCODED_RUSTFLAGS
    echo "build-image.sh: cargo build --profile $PROFILE --features $FEATURES" >&2
    cargo build --profile "$PROFILE" --locked --features "$FEATURES" --bin gpuscale
    binary="$target_dir/$PROFILE/gpuscale"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$out/work"
rm -rf "$work" "$out/oci" "$out/digest"
mkdir -p "$work"
SOURCE_DATE_EPOCH="$epoch" scripts/image-rootfs.sh "$binary" "$work/rootfs" "$out/packages.txt"

# Two layers: the Debian userland (changes with Debian updates) and the binary (with each commit).
# GNU tar with sorted names, one mtime, numeric owners and no extended attributes makes the same
# bytes for the same files; the home folder is owned by the user also when not built as root.
tar_flags=(--sort=name --format=gnu --mtime="@$epoch" --numeric-owner --no-acls --no-xattrs --no-selinux -C "$work/rootfs")
tar "${tar_flags[@]}" --owner=0 --group=0 --exclude=./home/nonroot --exclude=.$ENTRYPOINT -cf "$work/base.tar" .
tar "${tar_flags[@]}" --owner=65532 --group=65532 --no-recursion -rf "$work/base.tar" ./home/nonroot
tar "${tar_flags[@]}" --owner=0 --group=0 --no-recursion -cf "$work/gpuscale.tar" ./usr ./usr/bin ".$ENTRYPOINT"

oci="$out/oci"
image="$oci:$version"
umoci init --layout "$oci"
umoci new --image "$image"
packages="$(awk '{printf "%s%s=%s", (NR > 1 ? " " : ""), $1, $2}' "$out/packages.txt")"
umoci raw add-layer --image "$image" --history.created="$created" \
    --history.created_by="scripts/image-rootfs.sh: Debian $packages" "$work/base.tar"
umoci raw add-layer --image "$image" --history.created="$created" \
    --history.created_by="scripts/build-image.sh: gpuscale $version ($revision, features $FEATURES)" \
    "$work/gpuscale.tar"
config_flags=(--config.user="$IMAGE_USER" --config.workingdir="$WORKDIR" --config.entrypoint="$ENTRYPOINT")
for e in "${ENVIRONMENT[@]}"; do config_flags+=(--config.env="$e"); done
for l in "${LABELS[@]}"; do config_flags+=(--config.label="$l"); done
umoci config --image "$image" --no-history --created="$created" --architecture="$arch" --os=linux \
    "${config_flags[@]}"
umoci gc --layout "$oci"

manifest="$work/manifest.json"
skopeo inspect --raw "oci:$image" >"$manifest"
digest="sha256:$(sha256sum <"$manifest" | cut -d' ' -f1)"
echo "$digest" >"$out/digest"
archive="$out/gpuscale-$version-$arch.docker.tar"
rm -f "$archive"
skopeo copy --quiet "oci:$image" "docker-archive:$archive:$REPOSITORY:$version"

# Compressed size: what a registry stores and a node pulls (manifest, config, gzip layers).
compressed="$(grep -o '"size":[0-9]*' "$manifest" | cut -d: -f2 | awk -v m="$(wc -c <"$manifest")" '{s += $1} END {print s + m}')"
uncompressed="$(du -sb --apparent-size "$work/rootfs" | cut -f1)"
rm -rf "$work"
cat >&2 <<EOF
build-image.sh: built $REPOSITORY:$version ($arch), digest $digest
  OCI layout      oci:$oci:$version
  docker-archive  $archive
  packages        $out/packages.txt
  size            $compressed bytes compressed, $uncompressed bytes unpacked
EOF
