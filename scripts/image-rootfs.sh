#!/usr/bin/env bash
# Assembles the root file system of the gpuscale container image in a directory: a minimal,
# distroless-style Debian userland made from Debian's own packages (no base image is pulled), a
# non-root user, and the gpuscale binary. scripts/build-image.sh packs it into an OCI image with
# umoci; the Dockerfile runs this same script in its build stage and copies the result onto
# `scratch`, so both ways give the same files.
#
#   scripts/image-rootfs.sh BINARY ROOTFS [MANIFEST]
#
# BINARY is a release `gpuscale` for this machine's Debian architecture; it is installed stripped
# as /usr/bin/gpuscale. ROOTFS is created afresh. MANIFEST (optional) receives one line per
# Debian package used: name, version, architecture, sha256 of the .deb.
#
# What goes in, and why (see docs/image.md):
#   libc6, libgcc-s1   the dynamic loader, glibc and libgcc_s the binary links against
#   gcc-N-base         libgcc-s1's dependency (gcc-12-base on bookworm): its copyright file
#   ca-certificates    the Mozilla CA bundle, as /etc/ssl/certs/ca-certificates.crt (the cloud
#                      APIs and a kubeconfig without a CA are verified against it)
#   tzdata             /usr/share/zoneinfo, for TZ
#   base-files         only /etc/os-release, so that image scanners know the distribution
# Maintainer scripts are not run: what ca-certificates' postinst would generate (the bundle) is
# made here. Documentation other than copyright files is left out. Each package's control data is
# written to /var/lib/dpkg/status.d/<package> (as distroless images do) so scanners see versions.
#
# Environment:
#   SOURCE_DATE_EPOCH    every file's mtime (default 0); scripts/build-image.sh sets the commit time
#   GPUSCALE_DEB_CACHE   where downloaded .deb files are kept, one file per package version
#                        (default: ${CARGO_TARGET_DIR:-target}/image-cache/debs)
#   STRIP                the strip program (default: strip)
set -euo pipefail
umask 022
export LC_ALL=C

die() {
    echo "image-rootfs.sh: $*" >&2
    exit 1
}

[[ $# -ge 2 && $# -le 3 ]] || die "usage: scripts/image-rootfs.sh BINARY ROOTFS [MANIFEST]"
binary="$1"
rootfs="$2"
manifest="${3:-}"
[[ -f "$binary" ]] || die "no binary at $binary"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
epoch="${SOURCE_DATE_EPOCH:-0}"
cache="${GPUSCALE_DEB_CACHE:-${CARGO_TARGET_DIR:-$repo/target}/image-cache/debs}"

# The packages of the image; the Dockerfile gets them through this script too. libgcc-s1's
# gcc-N-base (its copyright file, which libgcc-s1's documentation links to) is added below, as
# libgcc-s1 of this machine's release names it.
PACKAGES=(libc6 libgcc-s1 ca-certificates tzdata)
# Packages of which only named files are taken.
OS_RELEASE_PACKAGE=base-files

arch="$(dpkg --print-architecture)"
case "$arch" in
    amd64) elf_machine="3e00" ;;
    arm64) elf_machine="b700" ;;
    *) die "unsupported architecture $arch (amd64 and arm64 are)" ;;
esac
# The binary must be for the architecture of the packages (ELF e_machine, bytes 18-19).
[[ "$(od -An -tx1 -j18 -N2 "$binary" | tr -d ' \n')" == "$elf_machine" ]] \
    || die "$binary is not an ELF executable for $arch"

# The candidate versions (and libgcc-s1's dependencies) of the packages, from apt's lists: one
# apt-cache call, each takes seconds.
declare -A version
gcc_base=""
read_versions() {
    local pkg="" line
    version=()
    while IFS= read -r line; do
        case "$line" in
            "Package: "*) pkg="${line#Package: }" ;;
            "Version: "*) version[$pkg]="${line#Version: }" ;;
            "Depends: "*) [[ "$pkg" != libgcc-s1 ]] || gcc_base="$(grep -o 'gcc-[0-9]*-base' <<<"$line" | head -n1)" ;;
        esac
    done < <(apt-cache show --no-all-versions "${PACKAGES[@]}" "$OS_RELEASE_PACKAGE" ${gcc_base:+"$gcc_base"} 2>/dev/null || true)
}
apt_update() {
    echo "image-rootfs.sh: apt-get update" >&2
    apt-get update -qq >&2 || die "apt-get update failed"
    apt_updated=true
    read_versions
}
apt_updated=false
read_versions
[[ -n "$gcc_base" ]] || apt_update
[[ -n "$gcc_base" ]] || die "apt knows no libgcc-s1 depending on a gcc-N-base package"
PACKAGES+=("$gcc_base")
read_versions
for pkg in "${PACKAGES[@]}" "$OS_RELEASE_PACKAGE"; do
    [[ -n "${version[$pkg]:-}" ]] || $apt_updated || apt_update
    [[ -n "${version[$pkg]:-}" ]] || die "apt knows no package $pkg"
done

# Prints the path of the cached .deb of package $1 at its candidate version, downloading it first
# if needed (after refreshing apt's lists once if they are stale).
fetch() {
    local pkg="$1" file tmp
    file="$cache/$arch/${pkg}_${version[$pkg]//:/%3a}.deb"
    if [[ ! -f "$file" ]]; then
        mkdir -p "$cache/$arch"
        tmp="$(mktemp -d "$cache/$arch/.download.XXXXXX")"
        # As root, apt would try to drop privileges to _apt, who cannot write here.
        if ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg=${version[$pkg]}" >&2); then
            rm -rf "$tmp"
            $apt_updated && die "cannot download $pkg=${version[$pkg]}"
            apt_update
            fetch "$pkg"
            return
        fi
        mv "$tmp"/*.deb "$file"
        rm -rf "$tmp"
    fi
    echo "$file"
}

rm -rf "$rootfs"
mkdir -p "$rootfs"
chmod 755 "$rootfs"
[[ -z "$manifest" ]] || : >"$manifest"

record() { # deb-file
    [[ -z "$manifest" ]] && return
    local fields
    fields="$(dpkg-deb --show --showformat='${Package} ${Version} ${Architecture}' "$1")"
    echo "$fields sha256:$(sha256sum "$1" | cut -d' ' -f1)" >>"$manifest"
}

mkdir -p "$rootfs/var/lib/dpkg/status.d"
for pkg in "${PACKAGES[@]}"; do
    deb="$(fetch "$pkg")"
    dpkg-deb --extract "$deb" "$rootfs"
    dpkg-deb --field "$deb" >"$rootfs/var/lib/dpkg/status.d/$pkg"
    record "$deb"
done
deb="$(fetch "$OS_RELEASE_PACKAGE")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dpkg-deb --extract "$deb" "$tmp"
mkdir -p "$rootfs/usr/lib"
cp -a "$tmp/usr/lib/os-release" "$rootfs/usr/lib/os-release"
cp -a "$tmp/etc/os-release" "$rootfs/etc/os-release" # a symlink to ../usr/lib/os-release
record "$deb"

# No manuals, no lintian overrides; of the documentation only the copyright files.
rm -rf "$rootfs/usr/share/man" "$rootfs/usr/share/info" "$rootfs/usr/share/lintian"
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -type l ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete

# What `update-ca-certificates` would make: every certificate of the package in one PEM file.
mkdir -p "$rootfs/etc/ssl/certs"
find "$rootfs/usr/share/ca-certificates" -name '*.crt' | sort | while read -r crt; do
    sed -e '$a\' "$crt"
done >"$rootfs/etc/ssl/certs/ca-certificates.crt"
grep -q 'BEGIN CERTIFICATE' "$rootfs/etc/ssl/certs/ca-certificates.crt" || die "no CA certificates"

# Users: root, nobody and the one gpuscale runs as (65532, as in distroless images and the chart).
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
# /etc/hosts first (Kubernetes writes it), then DNS.
cat >"$rootfs/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
shadow: files
hosts: files dns
networks: files
protocols: files
services: files
EOF
mkdir -p "$rootfs/root" "$rootfs/home/nonroot" "$rootfs/tmp"
chmod 700 "$rootfs/root" "$rootfs/home/nonroot"
chmod 1777 "$rootfs/tmp"
# Owner of the home folder; build-image.sh also sets it in the layer when not run as root.
chown 65532:65532 "$rootfs/home/nonroot" 2>/dev/null || true

mkdir -p "$rootfs/usr/bin"
"${STRIP:-strip}" --strip-all -o "$rootfs/usr/bin/gpuscale" "$binary"
chmod 755 "$rootfs/usr/bin/gpuscale"

find "$rootfs" -exec touch --no-dereference --date="@$epoch" {} +
