#!/usr/bin/env bash
# The container image test (run by scripts/test.sh): builds the image with scripts/build-image.sh
# twice and requires the same digest, checks its config with skopeo (user, entrypoint, working
# folder, environment, labels, architecture) against scripts/build-image.sh --print-config and
# that those checks catch a wrong image, checks the size budget and the docker-archive's name,
# then unpacks the image and runs it the way a node would: in that root file system, read-only,
# in its own mount and PID namespaces (gpuscale is PID 1, as in a container), as the image's user
# (65532:65532; tests/chart_render.rs checks that the chart runs it as that user too):
#   gpuscale --version                       the binary and its libraries load
#   gpuscale plan                            the embedded example plans
#   gpuscale agent                           no GPU driver in the image: serves /metrics with
#                                            gpuscale_agent_nvml_available 0, stops on SIGTERM
#   gpuscale run (AWS and GCP accounts,      the cloud providers are compiled in and the CA
#     a kubeconfig without a CA)             bundle loads (and without it, that it would not)
# and checks the CA bundle and time zone files with the host's openssl and glibc.
#
#   scripts/test-image.sh                  # as root; needs umoci, skopeo, jq, curl, openssl
#   scripts/test-image.sh --binary FILE    # the image of an existing gpuscale binary (no cargo)
#
# Without umoci or skopeo (scripts/test.sh installs them from Debian when it can) the test is
# skipped with a loud message. Output under ${CARGO_TARGET_DIR:-target}/image-test/.
set -euo pipefail
export LC_ALL=C
build_args=()
if [[ "${1:-}" == --binary && $# -eq 2 ]]; then
    build_args=(--binary "$(realpath "$2")")
elif [[ $# -gt 0 ]]; then
    echo "usage: scripts/test-image.sh [--binary FILE]" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() {
    echo "test-image.sh: FAILED: $*" >&2
    exit 1
}
say() { echo "test-image.sh: $*" >&2; }

if ! command -v umoci >/dev/null || ! command -v skopeo >/dev/null; then
    cat >&2 <<'EOF'
################################################################################
test-image.sh: SKIPPED: the container image test needs umoci and skopeo, which
are not installed here (apt-get install umoci skopeo). The image was NOT built
or tested.
################################################################################
EOF
    exit 0
fi
for tool in jq curl openssl unshare chroot python3; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install jq curl openssl util-linux coreutils)"
done
[[ "$(id -u)" == 0 ]] || die "must run as root (chroot, mount namespaces)"

start=$SECONDS
target="${CARGO_TARGET_DIR:-target}"
dir="$(mkdir -p "$target/image-test" && cd "$target/image-test" && pwd)"
rm -rf "${dir:?}"/*

# --- Build twice: the same inputs must give the same digest. The second build reuses the binary
# (cargo has nothing to do) and the cached .deb files, so it takes seconds.
if ((${#build_args[@]})); then
    say "building the image of ${build_args[1]} twice"
else
    say "building the image twice (the first time with cargo's release build of the container profile)"
fi
scripts/build-image.sh --out "$dir/a" "${build_args[@]}"
scripts/build-image.sh --out "$dir/b" "${build_args[@]}"
digest="$(cat "$dir/a/digest")"
[[ "$digest" == "$(cat "$dir/b/digest")" ]] \
    || die "two builds of the same commit differ: $digest and $(cat "$dir/b/digest")"
cmp -s "$dir/a/oci/index.json" "$dir/b/oci/index.json" || die "the two OCI indexes differ"
say "two builds give the same digest $digest"

# --- The image's config.
declare -A want
labels='{}'
envs='[]'
while read -r key value; do
    case "$key" in
        label) labels="$(jq -c --arg k "${value%%=*}" --arg v "${value#*=}" '. + {($k): $v}' <<<"$labels")" ;;
        env) envs="$(jq -c --arg e "$value" '. + [$e]' <<<"$envs")" ;;
        *) want[$key]="$value" ;;
    esac
done < <(scripts/build-image.sh --print-config)
version="${want[tag]}"
[[ "$version" == "$(sed -n '/^\[package\]/,/^\[/{s/^version = "\(.*\)"$/\1/p}' Cargo.toml)" ]] \
    || die "the image tag $version is not Cargo.toml's version"

# Exits non-zero, saying why, when the image's config is not the expected one.
check_config() { # oci-reference
    local ref="$1" config inspect
    config="$(skopeo inspect --config "$ref")" || { echo "skopeo inspect --config $ref failed"; return 1; }
    inspect="$(skopeo inspect "$ref")" || { echo "skopeo inspect $ref failed"; return 1; }
    jq -e --arg u "${want[user]}" '.config.User == $u' <<<"$config" >/dev/null \
        || { echo "user is $(jq -c .config.User <<<"$config"), not ${want[user]}"; return 1; }
    [[ "${want[user]}" != 0* ]] || { echo "the expected user is root"; return 1; }
    jq -e --arg e "${want[entrypoint]}" '.config.Entrypoint == [$e] and .config.Cmd == null' <<<"$config" >/dev/null \
        || { echo "entrypoint/cmd are $(jq -c '[.config.Entrypoint, .config.Cmd]' <<<"$config")"; return 1; }
    jq -e --arg w "${want[workdir]}" '.config.WorkingDir == $w' <<<"$config" >/dev/null \
        || { echo "working folder is $(jq -c .config.WorkingDir <<<"$config")"; return 1; }
    jq -e --argjson e "$envs" '.config.Env == $e' <<<"$config" >/dev/null \
        || { echo "environment is $(jq -c .config.Env <<<"$config")"; return 1; }
    jq -e --argjson l "$labels" '.Labels == $l' <<<"$inspect" >/dev/null \
        || { echo "labels are $(jq -c .Labels <<<"$inspect"), not the expected ones"; return 1; }
    for l in source version revision licenses; do
        jq -e --arg k "org.opencontainers.image.$l" '.Labels[$k] // "" | length > 0' <<<"$inspect" >/dev/null \
            || { echo "label org.opencontainers.image.$l is missing"; return 1; }
    done
    jq -e --arg a "${want[architecture]}" '.Architecture == $a and .Os == "linux"' <<<"$inspect" >/dev/null \
        || { echo "platform is $(jq -r '.Os + "/" + .Architecture' <<<"$inspect")"; return 1; }
}
why="$(check_config "oci:$dir/a/oci:$version")" || die "image config: $why"
# What a container runtime would run it as: the image's user, numeric (no name to look up).
user="$(skopeo inspect --config "oci:$dir/a/oci:$version" | jq -r .config.User)"
[[ "$user" =~ ^([1-9][0-9]*):([1-9][0-9]*)$ ]] || die "the image's user $user is not a numeric non-root uid:gid"
uid="${BASH_REMATCH[1]}" gid="${BASH_REMATCH[2]}"
say "config: user ${want[user]}, entrypoint ${want[entrypoint]}, labels, ${want[architecture]}: ok"

# The checks must catch a wrong image: copies with root as the user, without labels, with another
# entrypoint.
cp -a "$dir/b/oci" "$dir/broken"
umoci config --image "$dir/broken:$version" --tag root --config.user=0:0
umoci config --image "$dir/broken:$version" --tag unlabelled --clear=config.labels
umoci config --image "$dir/broken:$version" --tag shell --config.entrypoint=/bin/sh
for tag in root unlabelled shell; do
    if why="$(check_config "oci:$dir/broken:$tag")"; then
        die "the config check passes an image with the wrong $tag config"
    fi
    say "a broken image ($tag) is caught: $why"
done

# --- Size budget and the docker-archive: under 40 MB compressed (what a node pulls), of which the
# Debian layer at most 10 MB. A test binary (--binary, as in CI) is larger than the container
# profile's, so a test image within the budget means the release image is too.
skopeo inspect --raw "oci:$dir/a/oci:$version" >"$dir/manifest.json"
compressed="$(jq --argjson m "$(wc -c <"$dir/manifest.json")" '[.config.size, .layers[].size] | add + $m' "$dir/manifest.json")"
layers="$(jq -r '[.layers[].size] | map(tostring) | join(" ")' "$dir/manifest.json")"
read -r debian_layer binary_layer rest <<<"$layers"
[[ -n "$binary_layer" && -z "$rest" ]] || die "the image has layers of $layers bytes, not two (Debian, binary)"
((debian_layer < 10000000)) || die "the Debian layer is $debian_layer bytes compressed, over its 10 MB share of the budget"
((compressed < 40000000)) || die "the image is $compressed bytes compressed, over the 40 MB budget"
archive="$dir/a/gpuscale-$version-${want[architecture]}.docker.tar"
tags="$(tar -xOf "$archive" manifest.json | jq -c '[.[].RepoTags[]]')"
[[ "$tags" == "[\"${want[repository]}:$version\"]" ]] || die "the docker-archive is named $tags"
jq -e --argjson l "$labels" '.Labels == $l' <(skopeo inspect "docker-archive:$archive") >/dev/null \
    || die "the docker-archive's labels differ"
say "size: $compressed bytes compressed (Debian layer $debian_layer, binary layer $binary_layer), budget 40000000; docker-archive named ${want[repository]}:$version"

# --- The unpacked root file system.
rootfs="$dir/rootfs"
umoci raw unpack --image "$dir/a/oci:$version" "$rootfs"
uncompressed="$(du -sb --apparent-size "$rootfs" | cut -f1)"
[[ ! -e "$rootfs/bin/sh" && ! -e "$rootfs/usr/bin/sh" ]] || die "the image has a shell"
# The user has a passwd entry (for libraries that look up the home folder or name) whose home is
# the working folder, owned by the user.
entry="$(awk -F: -v u="$uid" '$3 == u' "$rootfs/etc/passwd")"
[[ "$(cut -d: -f4,6 <<<"$entry")" == "$gid:${want[workdir]}" ]] || die "no /etc/passwd entry $uid:$gid with home ${want[workdir]}: '$entry'"
awk -F: -v g="$gid" '$3 == g {f = 1} END {exit !f}' "$rootfs/etc/group" || die "no group $gid in /etc/group"
[[ "$(stat -c %u:%g:%a "$rootfs${want[workdir]}")" == "$uid:$gid:700" ]] || die "${want[workdir]} is not the user's"
[[ -z "$(find "$rootfs" -xdev \( -perm -4000 -o -perm -2000 \) -type f)" ]] || die "setuid/setgid files in the image"
while read -r pkg ver _; do
    [[ "$pkg" == base-files ]] && continue # only its os-release is in the image
    grep -qx "Version: $ver" "$rootfs/var/lib/dpkg/status.d/$pkg" 2>/dev/null \
        || die "no /var/lib/dpkg/status.d/$pkg with version $ver"
done <"$dir/a/packages.txt"
grep -q '^ID=debian$' "$rootfs/etc/os-release" || die "no Debian /etc/os-release"
bundle="$rootfs/etc/ssl/certs/ca-certificates.crt"
certs="$(openssl crl2pkcs7 -nocrl -certfile "$bundle" | openssl pkcs7 -print_certs -noout | grep -c '^subject=')" \
    || die "the CA bundle does not parse"
((certs >= 100)) || die "only $certs certificates in the CA bundle"
[[ "$(TZ=":$rootfs/usr/share/zoneinfo/Europe/Berlin" date -d @0 +%H:%Z)" == "01:CET" ]] \
    || die "the image's Europe/Berlin time zone file is wrong"
say "root file system: $uncompressed bytes; user $user, no shell, $certs CA certificates, zoneinfo, package records: ok"

# --- Running it. Mount points a container runtime would make, and a folder for test inputs
# (mounted read-only at /etc/gpuscale, where the chart mounts its config).
mkdir -p "$rootfs/proc" "$rootfs/etc/gpuscale"
inputs="$dir/inputs"
mkdir -p "$inputs" "$dir/empty"
image_env=(env -i)
while read -r e; do image_env+=("$e"); done < <(jq -r '.[]' <<<"$envs")
image_env+=("HOME=${want[workdir]}")

# Runs the arguments in the image as its user with the rootfs read-only, its own /proc, and
# extra mounts given as SOURCE:TARGET before `--`.
in_image() {
    local mounts=()
    while [[ "$1" != -- ]]; do mounts+=("$1"); shift; done
    shift
    "${image_env[@]}" unshare --mount --pid --fork --kill-child -- /bin/sh -c '
        set -e
        u="$1" r="$2"; shift 2
        mount --bind "$r" "$r"
        mount -o remount,bind,ro "$r"
        mount -t proc proc "$r/proc"
        while [ "$1" != -- ]; do
            mount --bind "${1%%:*}" "$r${1#*:}"
            mount -o remount,bind,ro "$r${1#*:}"
            shift
        done
        shift
        exec chroot --userspec="$u" "$r" "$@"
    ' sh "$user" "$rootfs" "$inputs:/etc/gpuscale" "${mounts[@]}" -- "$@"
}

out="$(in_image -- /usr/bin/gpuscale --version)" || die "gpuscale --version failed: $out"
[[ "$out" == "gpuscale $version" ]] || die "gpuscale --version says '$out', not 'gpuscale $version'"
say "gpuscale --version: $out"

plan="$(in_image -- /usr/bin/gpuscale plan 2>"$dir/plan.err")" || die "gpuscale plan failed: $(cat "$dir/plan.err")"
grep -q 'embedded example' "$dir/plan.err" || die "gpuscale plan did not plan the embedded example: $(cat "$dir/plan.err")"
[[ "$(wc -l <<<"$plan")" -ge 3 ]] || die "gpuscale plan printed no plan: $plan"
say "gpuscale plan: the embedded example planned ($(wc -l <<<"$plan") lines)"

# The agent, as the DaemonSet runs it but with no driver: NVML cannot load.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
image_env+=(NODE_NAME=image-test RUST_LOG=info)
in_image -- /usr/bin/gpuscale agent --listen "127.0.0.1:$port" --interval 1s --no-annotate \
    >/dev/null 2>"$dir/agent.err" &
agent=$!
trap 'kill -KILL $agent 2>/dev/null || true' EXIT
metrics=""
for _ in $(seq 1 300); do
    kill -0 $agent 2>/dev/null || die "the agent exited early: $(cat "$dir/agent.err")"
    metrics="$(curl -fsS "http://127.0.0.1:$port/metrics" 2>/dev/null || true)"
    if grep -qx 'gpuscale_agent_nvml_available 0' <<<"$metrics" \
        && ! grep -qx 'gpuscale_agent_samples_unavailable_total 0' <<<"$metrics" \
        && grep -q '^gpuscale_agent_samples_unavailable_total' <<<"$metrics"; then
        break
    fi
    metrics=""
    sleep 0.2
done
[[ -n "$metrics" ]] || die "no gpuscale_agent_nvml_available 0 on /metrics within 60s: $(cat "$dir/agent.err")"
[[ "$(curl -fsS "http://127.0.0.1:$port/healthz")" == ok ]] || die "the agent's /healthz is not ok"
# The agent is the last of the chain shell > unshare > gpuscale (PID 1 of its namespace): it must
# run as the image's user, its only group the user's, with no capabilities (the user switch drops
# root's).
pid=$agent
while children="$(cat "/proc/$pid/task/$pid/children")" && [[ -n "$children" ]]; do pid="${children%% *}"; done
[[ "$(cat "/proc/$pid/comm")" == gpuscale ]] || die "cannot find the agent's process (found $(cat "/proc/$pid/comm"))"
ids="$(awk '/^(Uid|Gid):/ {print $2, $3, $4, $5} /^Groups:/ {$1 = ""; print "groups" $0}' "/proc/$pid/status" | tr '\n' ' ')"
[[ "$ids" == "$uid $uid $uid $uid $gid $gid $gid $gid groups $gid " ]] \
    || die "the agent does not run as $user (groups: $gid only): $ids"
caps="$(awk '/^Cap(Prm|Eff):/ {print $2}' "/proc/$pid/status" | sort -u)"
[[ "$caps" == 0000000000000000 ]] || die "the agent has capabilities: $(grep ^Cap "/proc/$pid/status")"
kill -TERM "$pid"
status=0
wait $agent || status=$?
trap - EXIT
((status == 0)) || die "the agent exited with $status on SIGTERM: $(cat "$dir/agent.err")"
grep -q 'NVML unavailable' "$dir/agent.err" || die "the agent did not say NVML is unavailable: $(cat "$dir/agent.err")"
grep -q 'shutting down' "$dir/agent.err" || die "the agent did not shut down on SIGTERM: $(cat "$dir/agent.err")"
say "gpuscale agent: no driver, serves /metrics and /healthz as $user without capabilities, stops on SIGTERM"

# The controller with an AWS and a GCP account and a kubeconfig without a CA: the Kubernetes client
# must load the image's CA bundle, the AWS provider must be built and connect, and the GCP one
# must be built and fail only on the missing key file. Without the bundle, the client fails.
cat >"$inputs/kubeconfig" <<'EOF'
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: test, user: {token: test}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
EOF
cat >"$inputs/providers.yaml" <<'EOF'
accounts:
  - name: image-aws
    provider: aws
    region: us-east-1
    discovery: {namePrefix: gpu-}
  - name: image-gcp
    provider: gcp
    project: image-test
    region: us-central1
    nodeGroups: [{name: l4, instanceType: g2-standard-48, zones: [us-central1-a], minSize: 0, maxSize: 2}]
    credentials: {serviceAccountKeyFile: /etc/gpuscale/missing-key.json}
EOF
image_env+=(KUBECONFIG=/etc/gpuscale/kubeconfig)
run=(/usr/bin/gpuscale run --dry-run --providers /etc/gpuscale/providers.yaml --listen 127.0.0.1:0)
status=0
in_image -- "${run[@]}" >/dev/null 2>"$dir/run.err" || status=$?
err="$(cat "$dir/run.err")"
((status != 0)) || die "gpuscale run did not stop at the missing GCP key file: $err"
grep -q 'missing-key.json' <<<"$err" || die "gpuscale run did not reach the GCP provider: $err"
! grep -qi 'not compiled into this build\|CA certificates' <<<"$err" || die "gpuscale run: $err"
status=0
in_image "$dir/empty:/etc/ssl/certs" -- "${run[@]}" >/dev/null 2>"$dir/run-no-ca.err" || status=$?
err="$(cat "$dir/run-no-ca.err")"
((status != 0)) && grep -q 'No CA certificates' <<<"$err" \
    || die "without the CA bundle, gpuscale run did not fail on it: $err"
say "gpuscale run: AWS and GCP providers built in, CA bundle loaded (and missed without it)"

# Keep the image (a/) to look at; the second build, the broken copies and the root file system go.
rm -rf "$dir/b" "$dir/broken" "$rootfs"
cat >&2 <<EOF
test-image.sh: passed in $((SECONDS - start))s
  image          ${want[repository]}:$version (${want[architecture]}), digest $digest (twice)
  compressed     $compressed bytes
  unpacked       $uncompressed bytes
EOF
