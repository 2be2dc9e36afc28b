#!/usr/bin/env bash
# Builds AWS's instance metadata simulator, ec2-metadata-mock
# (github.com/aws/amazon-ec2-metadata-mock, from the Go module proxy), for the agent's
# interruption-notice test (tests/e2e/agent_annotate.rs), and prints the path of the binary.
#
#   scripts/aemm.sh        # prints e.g. target/aemm/v1.13.0/ec2-metadata-mock
#
# Built once per version and cached under target/aemm/ (ignored by git). About 40 s cold.
#
# Environment:
#   AEMM_BIN_DIR   where to put the binary (default: $CARGO_TARGET_DIR or ./target, /aemm/<version>).
set -euo pipefail

version=v1.13.0
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() {
    echo "aemm.sh: $*" >&2
    exit 1
}
command -v go >/dev/null || die "go is needed"
dest="${AEMM_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/aemm/$version}"
if [[ -x "$dest/ec2-metadata-mock" ]]; then
    echo "$dest/ec2-metadata-mock"
    exit 0
fi
echo "aemm.sh: building ec2-metadata-mock $version into $dest" >&2
start=$SECONDS
mkdir -p "$dest.partial"
CGO_ENABLED=0 GOBIN="$dest.partial" go install -trimpath -ldflags "-s -w" \
    "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@$version" || die "go install failed (see above)"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "aemm.sh: built in $((SECONDS - start)) s" >&2
echo "$dest/ec2-metadata-mock"
