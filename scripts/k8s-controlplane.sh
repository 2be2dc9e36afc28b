#!/usr/bin/env bash
# Builds the real Kubernetes control plane the integration tests run against — kube-apiserver,
# kube-scheduler and kube-controller-manager (tests run the controllers they need: resourceclaim,
# replicaset, garbage collector) from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3 — from the official Go
# modules (tests/k8s/controlplane/go.mod pins the versions), and prints the folder holding them.
#
#   scripts/k8s-controlplane.sh        # prints e.g. target/k8s/v1.35.4-<hash>/
#
# Built once per pinned version and cached under target/k8s/ (ignored by git); the key is the
# Kubernetes version and a hash of go.mod/go.sum, so a version bump rebuilds. A cold build takes
# 8-10 minutes on 2 cores (Go's module and build caches make later builds seconds).
#
# Environment:
#   K8S_BIN_DIR   where to put the binaries (default: $CARGO_TARGET_DIR or ./target, /k8s/<key>).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$repo/tests/k8s/controlplane"
die() {
    echo "k8s-controlplane.sh: $*" >&2
    exit 1
}
command -v go >/dev/null || die "go is needed (Go 1.25 or newer)"

version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$module/go.mod")"
[[ -n "$version" ]] || die "no k8s.io/kubernetes requirement in $module/go.mod"
hash="$(cat "$module/go.mod" "$module/go.sum" "$module"/cmd/*/main.go | sha256sum | cut -c1-12)"
dest="${K8S_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/k8s/$version-$hash}"

binaries=(etcd kube-apiserver kube-scheduler kube-controller-manager)
complete=1
for b in "${binaries[@]}"; do [[ -x "$dest/$b" ]] || complete=0; done
if [[ $complete == 1 ]]; then
    echo "$dest"
    exit 0
fi

echo "k8s-controlplane.sh: building ${binaries[*]} ($version) into $dest" >&2
start=$SECONDS
mkdir -p "$dest.partial"
minor="${version#v1.}"
minor="${minor%%.*}"
# The version stamp kube-apiserver reports in /version, as the release build sets it.
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
# Go's build cache for Kubernetes is ~4 GB and useless once the binaries are cached here, so the
# build uses its own cache and removes it (set GOCACHE to keep a shared one).
gocache="${GOCACHE:-}"
if [[ -z "$gocache" ]]; then
    gocache="$dest.gocache"
    trap 'rm -rf "$gocache"' EXIT
fi
(cd "$module" && GOCACHE="$gocache" CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" \
    -o "$dest.partial/" ./cmd/...) || die "go build failed (see above)"
for b in "${binaries[@]}"; do [[ -x "$dest.partial/$b" ]] || die "the build left no $b"; done
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "k8s-controlplane.sh: built in $((SECONDS - start)) s" >&2
echo "$dest"
