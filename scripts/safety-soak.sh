#!/usr/bin/env bash
# The long form of the fault-injection suite (tests/e2e/k8s_safety.rs): its scenarios again and again,
# each round with new seeds, for as long as asked, on the real control plane scripts/test.sh
# builds. Stops at the first round with a violation and keeps its output.
#
#   scripts/safety-soak.sh            # 1 hour
#   scripts/safety-soak.sh 6          # 6 hours
#
# Each round runs every scenario (the mutant tests, which must see violations, run once in the
# first round) with 4 seeds, so the figure to quote is rounds x 4 seeds x scenarios. Output and a
# summary go to ${CARGO_TARGET_DIR:-target}/safety-soak/.
#
# Environment: GPUSCALE_K8S_BIN (else built with scripts/k8s-controlplane.sh), SEEDS_PER_ROUND (4).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hours="${1:-1}"
per_round="${SEEDS_PER_ROUND:-4}"
out="${CARGO_TARGET_DIR:-target}/safety-soak"
mkdir -p "$out"
export GPUSCALE_K8S_BIN="${GPUSCALE_K8S_BIN:-$(scripts/k8s-controlplane.sh)}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Built once: the rounds run this binary, whatever is edited meanwhile.
binary="$(cargo test --all-features --test e2e --no-run --message-format=json |
    jq -r 'select(.profile.test == true and .target.name == "e2e") | .executable')"
[[ -x "$binary" ]] || { echo "safety-soak.sh: the e2e test binary was not built" >&2; exit 1; }
deadline=$((SECONDS + $(awk -v h="$hours" 'BEGIN {printf "%d", h * 3600}')))
summary="$out/summary.txt"
: >"$summary"
round=0
while ((SECONDS < deadline)); do
    first=$((round * per_round + 1))
    seeds="$(seq -s, "$first" $((first + per_round - 1)))"
    log="$out/round-$round.log"
    skip=()
    ((round == 0)) || skip=(--skip the_auditor_catches)
    start=$SECONDS
    if GPUSCALE_SAFETY_SEEDS="$seeds" "$binary" k8s_safety:: "${skip[@]}" --test-threads 1 >"$log" 2>&1; then
        passed="$(grep -o '[0-9]* passed' "$log" | tail -1)"
        echo "round $round seeds $seeds: $passed in $((SECONDS - start)) s" | tee -a "$summary" >&2
        rm -f "$log"
    else
        echo "round $round seeds $seeds: FAILED after $((SECONDS - start)) s, see $log" | tee -a "$summary" >&2
        exit 1
    fi
    round=$((round + 1))
done
echo "safety-soak: $round rounds of $per_round seeds, 0 violations ($summary)" >&2
