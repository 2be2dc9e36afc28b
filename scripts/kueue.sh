#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue, the version tests/k8s/kueue/go.mod pins)
# from the Go module proxy for tests/e2e/k8s_kueue.rs, and prints the path of the binary.
#
#   scripts/kueue.sh        # prints e.g. target/kueue/v0.17.0-<hash>/kueue
#
# Built once per pinned version and cached under target/kueue/ (ignored by git), keyed by the
# version and a hash of go.mod/go.sum. A cold build takes about 6 minutes on 2 cores.
#
# Environment:
#   KUEUE_BIN_DIR   where to put the binary (default: $CARGO_TARGET_DIR or ./target, /kueue/<key>).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$repo/tests/k8s/kueue"
die() {
    echo "kueue.sh: $*" >&2
    exit 1
}
command -v go >/dev/null || die "go is needed (Go 1.25 or newer)"
version="$(awk '($1 == "sigs.k8s.io/kueue") {print $2} ($1 == "require" && $2 == "sigs.k8s.io/kueue") {print $3}' "$module/go.mod")"
[[ -n "$version" ]] || die "no sigs.k8s.io/kueue requirement in $module/go.mod"
hash="$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)"
dest="${KUEUE_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/kueue/$version-$hash}"
if [[ -x "$dest/kueue" ]]; then
    echo "$dest/kueue"
    exit 0
fi
echo "kueue.sh: building Kueue $version into $dest" >&2
start=$SECONDS
mkdir -p "$dest.partial"
gocache="${GOCACHE:-}"
if [[ -z "$gocache" ]]; then
    gocache="$dest.gocache"
    trap 'rm -rf "$gocache"' EXIT
fi
(cd "$module" && GOCACHE="$gocache" CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" \
    -o "$dest.partial/kueue" sigs.k8s.io/kueue/cmd/kueue) || die "go build failed (see above)"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "kueue.sh: built in $((SECONDS - start)) s" >&2
echo "$dest/kueue"
