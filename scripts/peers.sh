#!/usr/bin/env bash
# Builds the real peer autoscalers that tests/e2e/k8s_peers.rs runs beside gpuscale, from the Go module
# proxy, and prints the path of the binary:
#
#   scripts/peers.sh karpenter            # Karpenter with its kwok cloud provider (karpenter-kwok)
#   scripts/peers.sh cluster-autoscaler   # Cluster Autoscaler (its kwok provider is in the default build)
#   scripts/peers.sh table                # builds both, runs the full side-by-side table (docs/peers.md)
#                                         # and prints it (GPUSCALE_PEERS_BURST=N: a burst of N, not 100);
#                                         # each scenario's GPUs over time as SVG and CSV in
#                                         # ${GPUSCALE_PEERS_PLOTS:-<cache>/plots}
#
# Each is built once per pinned version and cached under ${CARGO_TARGET_DIR:-target}/peers/ (ignored
# by git). Cold builds on 2 shared cores (measured 2026-12-07, docs/peers.md): Karpenter 286 s,
# Cluster Autoscaler 835 s (beside a cargo build); together far past CI's budget, so scripts/test.sh
# does not build them and tests/e2e/k8s_peers.rs's peer smoke tests skip, saying so, unless
# GPUSCALE_KARPENTER_BIN / GPUSCALE_CLUSTER_AUTOSCALER_BIN are set.
#
# Karpenter: sigs.k8s.io/karpenter/kwok at the version tests/k8s/peers/karpenter/go.mod pins (it
# declares go 1.26.9, which the proxy serves as a toolchain: GOTOOLCHAIN=go1.26.9); the key is the
# version and a hash of go.mod/go.sum.
#
# Cluster Autoscaler: the proxy serves k8s.io/autoscaler/cluster-autoscaler only as one pseudo-version
# (a 1.31-era commit) and only as a .zip (its .mod is refused, so `go install` and `go mod download`
# fail); its go.mod has 34 `replace` lines, so it is built inside the unpacked tree. Its nested
# `apis` module (replaced by ./apis, which the zip lacks) is on no module proxy at that commit (the
# one its go.mod requires is older and lacks ProvisioningRequest v1), so it comes from a git
# directory of kubernetes/autoscaler: AUTOSCALER_GIT (only the cluster-autoscaler/apis folder is
# read, with `git archive`).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="${CARGO_TARGET_DIR:-$repo/target}/peers"
die() {
    echo "peers.sh: $*" >&2
    exit 1
}
command -v go >/dev/null || die "go is needed (Go 1.22 or newer; Karpenter fetches its own toolchain)"

# Runs `build <dir>` into <dest>.partial unless <dest>/<name> exists; prints the binary's path.
cached() {
    local dest="$1" name="$2" build="$3"
    if [[ -x "$dest/$name" ]]; then
        echo "$dest/$name"
        return
    fi
    echo "peers.sh: building $name into $dest" >&2
    local start=$SECONDS
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    local gocache="${GOCACHE:-$dest.gocache}"
    GOCACHE="$gocache" "$build" "$dest.partial" && [[ -x "$dest.partial/$name" ]] \
        || die "building $name failed (see above)"
    [[ -n "${GOCACHE:-}" ]] || rm -rf "$gocache"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    echo "peers.sh: built $name in $((SECONDS - start)) s" >&2
    echo "$dest/$name"
}

karpenter_module="$repo/tests/k8s/peers/karpenter"
build_karpenter() {
    (cd "$karpenter_module" && GOTOOLCHAIN=go1.26.9 CGO_ENABLED=0 GOFLAGS=-mod=readonly \
        go build -trimpath -ldflags "-s -w" -o "$1/karpenter-kwok" sigs.k8s.io/karpenter/kwok)
}
karpenter() {
    local version hash
    version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/karpenter" {print $3}' "$karpenter_module/go.mod")"
    [[ -n "$version" ]] || die "no sigs.k8s.io/karpenter requirement in $karpenter_module/go.mod"
    hash="$(cat "$karpenter_module/go.mod" "$karpenter_module/go.sum" | sha256sum | cut -c1-12)"
    local bin
    bin="$(cached "$root/karpenter/$version-$hash" karpenter-kwok build_karpenter)"
    # Its CRDs (the kwok chart's set and the KWOKNodeClass), beside the binary for the harness.
    local crds="${bin%/*}/crds"
    if [[ ! -d "$crds" ]]; then
        local dir
        dir="$(cd "$karpenter_module" && GOTOOLCHAIN=go1.26.9 go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)"
        mkdir -p "$crds.partial"
        cp "$dir"/kwok/charts/crds/*.yaml "$dir"/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml "$crds.partial/"
        chmod -R u+w "$crds.partial"
        mv "$crds.partial" "$crds"
    fi
    echo "$bin"
}

ca_module=k8s.io/autoscaler/cluster-autoscaler
ca_version=v0.0.0-20240830133931-adfbe7e45277
ca_commit=adfbe7e45277
build_cluster_autoscaler() {
    local out="$1" src="$1/src"
    local proxy="${GOPROXY:-https://proxy.golang.org}"
    proxy="${proxy%%,*}"
    command -v curl >/dev/null && command -v unzip >/dev/null || die "curl and unzip are needed"
    [[ -n "${AUTOSCALER_GIT:-}" ]] && git --git-dir="$AUTOSCALER_GIT" cat-file -e "$ca_commit" 2>/dev/null \
        || die "set AUTOSCALER_GIT to a git directory of kubernetes/autoscaler with commit $ca_commit (its cluster-autoscaler/apis module is on no module proxy; e.g. git clone --bare --filter=blob:none https://github.com/kubernetes/autoscaler)"
    curl -fsSL -o "$out/ca.zip" "$proxy/$ca_module/@v/$ca_version.zip" || return 1
    mkdir -p "$src"
    unzip -q "$out/ca.zip" -d "$src" && rm "$out/ca.zip" || return 1
    local tree="$src/$ca_module@$ca_version"
    chmod -R u+w "$tree"
    mkdir -p "$tree/apis"
    git --git-dir="$AUTOSCALER_GIT" archive "$ca_commit:cluster-autoscaler/apis" | tar -x -C "$tree/apis" || return 1
    (cd "$tree" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/cluster-autoscaler" .) \
        || return 1
    chmod -R u+w "$src" && rm -rf "$src"
}
cluster_autoscaler() {
    cached "$root/cluster-autoscaler/$ca_version" cluster-autoscaler build_cluster_autoscaler
}

case "${1:-}" in
karpenter) karpenter ;;
cluster-autoscaler) cluster_autoscaler ;;
table)
    GPUSCALE_KARPENTER_BIN="$(karpenter)"
    GPUSCALE_CLUSTER_AUTOSCALER_BIN="$(cluster_autoscaler)"
    export GPUSCALE_KARPENTER_BIN GPUSCALE_CLUSTER_AUTOSCALER_BIN
    [[ -n "${GPUSCALE_K8S_BIN:-}" ]] || GPUSCALE_K8S_BIN="$("$repo/scripts/k8s-controlplane.sh")"
    export GPUSCALE_K8S_BIN
    cd "$repo"
    table="$root/table.md"
    rm -f "$table"
    GPUSCALE_PEERS_TABLE="$table" GPUSCALE_PEERS_PLOTS="${GPUSCALE_PEERS_PLOTS:-$root/plots}" cargo test --all-features --test e2e \
        -- --ignored --nocapture --test-threads=1 k8s_peers::peer_table >&2
    echo "peers.sh: the table (for docs/peers.md) is in $table, GPUs over time in ${GPUSCALE_PEERS_PLOTS:-$root/plots}" >&2
    cat "$table"
    ;;
*) die "usage: scripts/peers.sh karpenter|cluster-autoscaler|table" ;;
esac
