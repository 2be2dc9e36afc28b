//! Malformed and hostile snapshots, as `gpuscale plan` meets them from the command line: each is
//! refused with exit code 2, a message naming the file (and the object and field where there is
//! one), no plan on stdout, and bounded cost. Cost is measured per process (peak RSS by GNU
//! time, wall time) and printed; the assertions use inputs whose unbounded cost would be
//! obvious (a billion GPUs, megabytes of nesting, endless zeros) with generous ceilings, so they
//! hold on a loaded machine and fail only when a bound is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROVIDERS: &str = "examples/providers/aws.yaml";
/// Peak memory every refusal stays under (the issue's bound).
const MAX_RSS_KIB: i64 = 100 * 1024;
/// A ceiling far above the ~20 ms these take, far below what an unbounded input costs.
const MAX_WALL: Duration = Duration::from_secs(20);

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
    wall: Duration,
}

/// GNU time, which measures a process it starts itself: a child's peak RSS read by the test's
/// own `wait4` would include the test process, which Linux carries across `execve`.
const GNU_TIME: &str = "/usr/bin/time";

/// Runs `gpuscale args..` and measures its peak RSS and wall time.
fn run(args: &[&str]) -> Outcome {
    assert!(
        Path::new(GNU_TIME).exists(),
        "{GNU_TIME} is missing: install Debian's `time` package (scripts/test.sh does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (out, err, rss) = (dir.path().join("out"), dir.path().join("err"), dir.path().join("rss"));
    let start = Instant::now();
    let status = Command::new(GNU_TIME)
        .args(["-f", "%M", "-o", rss.to_str().unwrap(), env!("CARGO_BIN_EXE_gpuscale")])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .status()
        .expect("gpuscale starts under GNU time");
    let wall = start.elapsed();
    let rss = std::fs::read_to_string(&rss).unwrap();
    Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(out).unwrap(),
        stderr: std::fs::read_to_string(err).unwrap(),
        max_rss_kib: rss
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("{rss}")),
        wall,
    }
}

fn pod(extra: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p","namespace":"ml"}}{extra}}}]}}"#
    )
}

fn node(labels: &str, allocatable: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"gpu-1","labels":{{{labels}}}}},"status":{{"allocatable":{{{allocatable}}},"conditions":[{{"type":"Ready","status":"True"}}]}}}}]}}"#
    )
}

/// A YAML alias bomb: ten levels of nine references each.
fn laughs() -> String {
    let mut s = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = format!("*a{}", i - 1);
        s += &format!("a{i}: &a{i} [{}]\n", [p.as_str(); 9].join(", "));
    }
    s
}

#[test]
fn every_malformed_snapshot_is_refused_with_exit_2_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, bytes: Vec<u8>| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let empty_dir = dir.path().join("empty-folder");
    std::fs::create_dir(&empty_dir).unwrap();
    let running = pod(r#","spec":{"containers":[{"name":"c"}]},"status":{"phase":"Running"}"#);
    let unequal = pod(
        r#","spec":{"containers":[{"name":"c","resources":{"requests":{"nvidia.com/gpu":"1"},"limits":{"nvidia.com/gpu":"4"}}}]}"#,
    );
    // (name, file, words the message must contain)
    let cases: Vec<(&str, PathBuf, Vec<&str>)> = vec![
        ("empty file", file("empty.json", vec![]), vec!["empty.json", "no Kubernetes objects"]),
        ("null", file("null.yaml", b"null\n".to_vec()), vec!["null.yaml", "no Kubernetes objects"]),
        ("{}", file("obj.json", b"{}".to_vec()), vec!["obj.json", "no kind"]),
        ("[]", file("arr.json", b"[]".to_vec()), vec!["arr.json", "no Kubernetes objects"]),
        (
            "items null",
            file("items-null.json", br#"{"apiVersion":"v1","kind":"List","items":null}"#.to_vec()),
            vec!["items-null.json", "items"],
        ),
        (
            "items [null]",
            file("item-null.json", br#"{"apiVersion":"v1","kind":"List","items":[null]}"#.to_vec()),
            vec!["item-null.json items[0]", "must be an object"],
        ),
        ("no kind", file("nokind.yaml", b"metadata: {name: x}\n".to_vec()), vec!["nokind.yaml", "no kind"]),
        ("empty folder", empty_dir.clone(), vec!["empty-folder", "no *.json"]),
        ("provider file as snapshot", PathBuf::from(PROVIDERS), vec!["aws.yaml", "no kind"]),
        ("pod without spec", file("nospec.json", pod("").into_bytes()), vec!["Pod ml/p", "spec"]),
        (
            "null containers",
            file("nullcont.json", pod(r#","spec":{"containers":null}"#).into_bytes()),
            vec!["Pod ml/p", "spec.containers"],
        ),
        ("running, no node", file("running.json", running.into_bytes()), vec!["Pod ml/p", "spec.nodeName"]),
        (
            "request != limit",
            file("unequal.json", unequal.into_bytes()),
            vec!["Pod ml/p", "spec.containers[0].resources.requests.nvidia.com/gpu"],
        ),
        (
            "a billion GPUs",
            file("gpus.json", node("", r#""nvidia.com/gpu":"1000000000""#).into_bytes()),
            vec!["Node gpu-1", "status.allocatable.nvidia.com/gpu", "1000000000"],
        ),
        (
            "a million replicas",
            file(
                "replicas.json",
                node(r#""nvidia.com/gpu.replicas":"1000000""#, r#""nvidia.com/gpu":"8""#).into_bytes(),
            ),
            vec!["Node gpu-1", "nvidia.com/gpu.replicas"],
        ),
        (
            "a hundred million MIG instances",
            file(
                "mig.json",
                node(
                    r#""nvidia.com/gpu.product":"NVIDIA-A100-SXM4-40GB""#,
                    r#""nvidia.com/mig-1g.5gb":"100000000""#,
                )
                .into_bytes(),
            ),
            vec!["Node gpu-1", "nvidia.com/mig-1g.5gb"],
        ),
        ("2 MB of [ (YAML)", file("deep.yaml", vec![b'['; 2 << 20]), vec!["deep.yaml", "nesting deeper"]),
        ("2 MB of [ (JSON)", file("deep.json", vec![b'['; 2 << 20]), vec!["deep.json", "nesting deeper"]),
        (
            "binary",
            file("blob.json", (0..=255u8).cycle().take(1 << 20).collect()),
            vec!["blob.json", "not a text file"],
        ),
        ("/dev/zero", PathBuf::from("/dev/zero"), vec!["/dev/zero", "not a text file"]),
        (
            "alias bomb",
            file("laughs.yaml", laughs().into_bytes()),
            vec!["laughs.yaml", "aliases expand past"],
        ),
    ];
    let mut report = Vec::new();
    for (name, path, words) in &cases {
        let o = run(&["plan", "--snapshot", path.to_str().unwrap(), "--providers", PROVIDERS]);
        report.push(format!(
            "{name:36} exit {:?}  {:>5} ms  {:>6} KiB",
            o.code,
            o.wall.as_millis(),
            o.max_rss_kib
        ));
        assert_eq!(o.code, Some(2), "{name}: {}", o.stderr);
        assert!(o.stdout.is_empty(), "{name}: a plan was printed: {}", o.stdout);
        for w in words {
            assert!(o.stderr.contains(w), "{name}: {w:?} not in: {}", o.stderr);
        }
        assert!(o.max_rss_kib < MAX_RSS_KIB, "{name}: peak RSS {} KiB", o.max_rss_kib);
        assert!(o.wall < MAX_WALL, "{name}: took {:?}", o.wall);
    }
    // The size limit, on a valid file larger than it.
    let big = file(
        "big.json",
        format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[],\"pad\":\"{}\"}}",
            "x".repeat(3 << 20)
        )
        .into_bytes(),
    );
    let o =
        run(&["plan", "--snapshot", big.to_str().unwrap(), "--providers", PROVIDERS, "--max-input-mib", "1"]);
    report.push(format!(
        "{:36} exit {:?}  {:>5} ms  {:>6} KiB",
        "3 MiB over a 1 MiB limit",
        o.code,
        o.wall.as_millis(),
        o.max_rss_kib
    ));
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("big.json") && o.stderr.contains("--max-input-mib"), "{}", o.stderr);
    println!("{}", report.join("\n"));
}

#[test]
fn inputs_people_have_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(
        r#""node.kubernetes.io/instance-type":"p4d.24xlarge""#,
        r#""cpu":"96","memory":"1100Gi","nvidia.com/gpu":"8""#,
    );
    // UTF-8 with a byte-order mark, and UTF-16 as PowerShell's `>` writes it.
    let bom = dir.path().join("bom.json");
    std::fs::write(&bom, [b"\xEF\xBB\xBF".as_slice(), node.as_bytes()].concat()).unwrap();
    let utf16 = dir.path().join("utf16.json");
    let le: Vec<u8> =
        [0xFF, 0xFE].into_iter().chain(node.encode_utf16().flat_map(u16::to_le_bytes)).collect();
    std::fs::write(&utf16, le).unwrap();
    for f in [&bom, &utf16] {
        let o = run(&["plan", "--snapshot", f.to_str().unwrap(), "--providers", PROVIDERS]);
        assert_eq!(o.code, Some(0), "{}: {}", f.display(), o.stderr);
        assert!(o.stderr.contains("nodes=1"), "{}", o.stderr);
    }
    // A manifest folder with a Helm template and a binary file among the manifests.
    let folder = dir.path().join("manifests");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("node.json"), &node).unwrap();
    std::fs::write(folder.join("deploy.yaml"), "kind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n  labels: {{- include \"l\" . | nindent 4 }}\n").unwrap();
    std::fs::write(folder.join("logo.yaml"), (0..=255u8).collect::<Vec<_>>()).unwrap();
    let o = run(&["plan", "--snapshot", folder.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stderr.contains("deploy.yaml") && o.stderr.contains("Helm"), "{}", o.stderr);
    assert!(o.stderr.contains("logo.yaml") && o.stderr.contains("not a text file"), "{}", o.stderr);
    assert!(o.stderr.contains("nodes=1"), "{}", o.stderr);
    // YAML merge keys.
    let merged = dir.path().join("merged.yaml");
    std::fs::write(
        &merged,
        "apiVersion: v1\nkind: List\nitems:\n- &n\n  apiVersion: v1\n  kind: Node\n  metadata: {name: a}\n  status: {allocatable: {cpu: \"8\", memory: 32Gi}}\n- <<: *n\n  metadata: {name: b}\n",
    )
    .unwrap();
    let o = run(&["plan", "--snapshot", merged.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stderr.contains("nodes=2"), "{}", o.stderr);
    // A provider folder.
    let providers = dir.path().join("providers");
    std::fs::create_dir(&providers).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(PROVIDERS), providers.join("aws.yaml")).unwrap();
    let o = run(&[
        "plan",
        "--snapshot",
        bom.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let plan: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(plan["costBeforePerHourUsd"], 0.0, "the node is in no group of the account: {plan}");
}

#[test]
fn the_snapshot_can_come_from_standard_input() {
    let snapshot = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/snapshots/mixed-gpu-cluster.json"),
    )
    .unwrap();
    let run_with_stdin = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&snapshot).unwrap();
        child.wait_with_output().unwrap()
    };
    let from_stdin = run_with_stdin(&["plan", "--snapshot", "-", "--providers", PROVIDERS]);
    assert!(from_stdin.status.success(), "{}", String::from_utf8_lossy(&from_stdin.stderr));
    let from_file =
        run(&["plan", "--snapshot", "examples/snapshots/mixed-gpu-cluster.json", "--providers", PROVIDERS]);
    assert_eq!(String::from_utf8_lossy(&from_stdin.stdout), from_file.stdout);
    assert!(from_file.stdout.contains("FITS"), "{}", from_file.stdout);
}

/// A List of `items` (JSON texts).
fn list(items: &[String]) -> String {
    format!(r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#, items.join(","))
}

const TEMPLATE: &str = r#"{"apiVersion":"v1","kind":"PodTemplate","metadata":{"name":"t","namespace":"ml"},"template":{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}"#;

fn request(counts: &[u64]) -> String {
    let sets: Vec<String> =
        counts.iter().map(|c| format!(r#"{{"count":{c},"podTemplateRef":{{"name":"t"}}}}"#)).collect();
    format!(
        r#"{{"apiVersion":"autoscaling.x-k8s.io/v1","kind":"ProvisioningRequest","metadata":{{"name":"r","namespace":"ml"}},"spec":{{"provisioningClassName":"check-capacity.autoscaling.x-k8s.io","podSets":[{}]}}}}"#,
        sets.join(",")
    )
}

fn claim(expression: &str, count: u64) -> String {
    format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{{"name":"c","namespace":"ml"}},"spec":{{"devices":{{"requests":[{{"name":"g","exactly":{{"deviceClassName":"gpu","count":{count},"selectors":[{{"cel":{{"expression":{}}}}}]}}}}]}}}}}}"#,
        serde_json::Value::String(expression.into())
    )
}

fn labels(n: usize) -> String {
    let labels: Vec<String> = (0..n).map(|i| format!(r#""k{i}":"v""#)).collect();
    format!(
        r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"gpu-1","labels":{{{}}}}},"status":{{"allocatable":{{"cpu":"8"}}}}}}"#,
        labels.join(",")
    )
}

/// Every count and size an object can set is bounded while it is read (`src/limits.rs`): each
/// input is refused with exit 2 naming file, object, field and value, in bounded time, and with
/// peak memory at most three times the input (above the process's own baseline).
#[test]
fn every_count_and_size_is_bounded_before_it_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: String| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let deep = |n: usize| format!("{}true{}", "(".repeat(n), ")".repeat(n));
    let slice = |n: usize| {
        // (Two megabytes: within the object size, so the device count is what refuses it.)
        let devices: Vec<String> = (0..n).map(|i| format!(r#"{{"name":"gpu-{i}"}}"#)).collect();
        format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{{"name":"s"}},"spec":{{"driver":"gpu.nvidia.com","nodeName":"n","pool":{{"name":"p","generation":1,"resourceSliceCount":1}},"devices":[{}]}}}}"#,
            devices.join(",")
        )
    };
    let class = format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{{"name":"gpu"}},"spec":{{"selectors":[{{"cel":{{"expression":"{}"}}}}]}}}}"#,
        deep(3000)
    );
    let annotations = pod(&format!(
        r#","metadata":{{"name":"p","namespace":"ml","annotations":{{"a":"{}"}}}},"spec":{{"containers":[{{"name":"c"}}]}}"#,
        "x".repeat(300 << 10)
    ));
    let huge_pod = pod(&format!(
        r#","spec":{{"containers":[{{"name":"c","env":[{{"name":"E","value":"{}"}}]}}]}}"#,
        "x".repeat(4 << 20)
    ));
    // The same bounds on YAML, which is transcoded to JSON text as it is parsed: a million
    // labels in one object, in a List item, and in the second of two documents.
    let yaml_labels =
        |indent: &str| -> String { (0..1_000_000).map(|i| format!("{indent}k{i}: v\n")).collect() };
    let yaml_node = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: gpu-1\n  labels:\n{}status:\n  allocatable:\n    cpu: '8'\n",
        yaml_labels("    ")
    );
    let yaml_list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: gpu-1\n    labels:\n{}",
        yaml_labels("      ")
    );
    let yaml_docs = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ml\n---\n{yaml_node}");
    let empties = format!(r#"{{"apiVersion":"v1","kind":"List","items":[{}{{}}]}}"#, "{},".repeat(1_000_000));
    // (name, file, words the message must contain)
    let cases: Vec<(&str, PathBuf, Vec<&str>)> = vec![
        (
            "pod set of 2^31-1 pods",
            file("pr-max.json", list(&[TEMPLATE.into(), request(&[2147483647])])),
            vec!["pr-max.json items[1]", "ProvisioningRequest ml/r", "spec.podSets[0].count", "2147483647"],
        ),
        (
            "pod set of a million pods",
            file("pr-1e6.json", list(&[TEMPLATE.into(), request(&[1_000_000])])),
            vec!["ProvisioningRequest ml/r", "spec.podSets[0].count", "1000000"],
        ),
        (
            "pod sets over the request bound",
            file("pr-sum.json", list(&[TEMPLATE.into(), request(&[10_000, 10_000])])),
            vec!["ProvisioningRequest ml/r", "spec.podSets", "20000 pods"],
        ),
        (
            "33 pod sets",
            file("pr-sets.json", list(&[TEMPLATE.into(), request(&[1; 33])])),
            vec!["ProvisioningRequest ml/r", "spec.podSets", "more than 32 pod sets"],
        ),
        (
            "a million labels (List)",
            file("labels.json", list(&[labels(1_000_000)])),
            vec![
                "labels.json items[0]",
                "Node gpu-1",
                "(object)",
                "bytes",
                "the most the API server accepts",
            ],
        ),
        (
            "a million labels (one object)",
            file("labels-one.json", labels(1_000_000)),
            vec!["labels-one.json: Node gpu-1", "(object)"],
        ),
        (
            "a million labels (YAML object)",
            file("labels-one.yaml", yaml_node),
            vec!["labels-one.yaml: Node gpu-1", "(object)", "the most the API server accepts"],
        ),
        (
            "a million labels (YAML List)",
            file("labels.yaml", yaml_list),
            vec!["labels.yaml items[0]", "Node gpu-1", "(object)"],
        ),
        (
            "a million labels (YAML doc 2)",
            file("labels-docs.yaml", yaml_docs),
            vec!["labels-docs.yaml doc 2", "Node gpu-1", "(object)"],
        ),
        (
            "5,000 labels",
            file("labels-5000.json", list(&[labels(5000)])),
            vec!["Node gpu-1", "metadata.labels", "more than 4096 labels"],
        ),
        (
            "100,000 devices in a slice",
            file("slice.json", list(&[slice(100_000)])),
            vec!["ResourceSlice s", "spec.devices", "more than 128 devices", "ResourceSliceMaxDevices"],
        ),
        (
            "selector of 3,000 parentheses",
            file("class.json", list(&[class])),
            vec!["DeviceClass gpu", "spec.selectors[0].cel.expression", "nested deeper than 250"],
        ),
        (
            "claim selector 10,000 deep",
            file("claim-deep.json", list(&[claim(&"(".repeat(10_000), 1)])),
            vec![
                "ResourceClaim ml/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "nested deeper",
            ],
        ),
        (
            "claim selector of 20 KiB",
            file("claim-long.json", list(&[claim(&format!("'{}' == 'x'", "x".repeat(20 << 10)), 1)])),
            vec!["ResourceClaim ml/c", "cel.expression", "20489 bytes", "CELSelectorExpressionMaxLength"],
        ),
        (
            "claim of 2^32 devices",
            file("claim-count.json", list(&[claim("true", 1 << 32)])),
            vec!["ResourceClaim ml/c", "spec.devices.requests[0].exactly.count", "4294967296"],
        ),
        (
            "300 KiB of annotations",
            file("annotations.json", annotations),
            vec!["Pod ml/p", "metadata.annotations", "262144 bytes"],
        ),
        (
            "a 4 MiB pod",
            file("huge-pod.json", huge_pod),
            vec!["huge-pod.json items[0]", "Pod ml/p", "(object)", "3145728 bytes"],
        ),
        (
            "a million and one items",
            file("items.json", empties),
            vec!["items.json", "items", "more than 1000000 items"],
        ),
        (
            "v1 List without items",
            file("no-items.json", r#"{"apiVersion":"v1","kind":"List"}"#.into()),
            vec!["no-items.json", "items: missing"],
        ),
        (
            "invalid limit beside a request",
            file(
                "limit.json",
                pod(
                    r#","spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"1"},"limits":{"cpu":"1x"}}}]}"#,
                ),
            ),
            vec!["Pod ml/p", "spec.containers[0].resources.limits.cpu", "1x"],
        ),
        (
            "request above its limit",
            file(
                "above.json",
                pod(
                    r#","spec":{"containers":[{"name":"c","resources":{"requests":{"memory":"2Gi"},"limits":{"memory":"1Gi"}}}]}"#,
                ),
            ),
            vec!["Pod ml/p", "spec.containers[0].resources.requests.memory", "may not exceed the limit 1Gi"],
        ),
    ];
    let mut report = Vec::new();
    for (name, path, words) in &cases {
        let size_kib = std::fs::metadata(path).unwrap().len() as i64 / 1024;
        let o = run(&["plan", "--snapshot", path.to_str().unwrap(), "--providers", PROVIDERS]);
        report.push(format!(
            "{name:36} exit {:?}  {:>5} ms  {:>6} KiB peak  {:>6} KiB input",
            o.code,
            o.wall.as_millis(),
            o.max_rss_kib,
            size_kib
        ));
        assert_eq!(o.code, Some(2), "{name}: {}", o.stderr);
        assert!(o.stdout.is_empty(), "{name}: a plan was printed: {}", o.stdout);
        for w in words {
            assert!(o.stderr.contains(w), "{name}: {w:?} not in: {}", o.stderr);
        }
        // The process's baseline (the binary, the catalog, the allocator) plus three times the
        // input; a List also indexes its items as it reads them (a pointer and a length each,
        // with the vector's growth), which only a List of a million empty objects notices.
        let items = if *name == "a million and one items" { 1_000_001 } else { 0 };
        let ceiling = BASELINE_RSS_KIB + 3 * size_kib + items * ITEM_INDEX_BYTES / 1024;
        assert!(o.max_rss_kib < ceiling, "{name}: peak RSS {} KiB over {ceiling} KiB", o.max_rss_kib);
        assert!(o.wall < MAX_WALL, "{name}: took {:?}", o.wall);
    }
    println!("{}", report.join("\n"));
}

/// What a refusal of a small input costs in memory: the binary, its embedded catalogs and the
/// allocator's arenas.
const BASELINE_RSS_KIB: i64 = 40 * 1024;

/// What a List's index of its items costs per item at most, growth included.
const ITEM_INDEX_BYTES: i64 = 32;

/// Kinds the plan reads, in API versions it does not, unknown instance types of a group's nodes
/// and MIG layouts the GPU cannot hold: each object is named in its own warning; duplicate JSON
/// keys keep the last value, as kubectl does.
#[test]
fn unknown_versions_are_named_per_object_and_the_last_duplicate_key_wins() {
    let dir = tempfile::tempdir().unwrap();
    let gpu_node =
        |allocatable: &str| node(r#""node.kubernetes.io/instance-type":"p4d.24xlarge""#, allocatable);
    let ok = gpu_node(r#""cpu":"96","memory":"1100Gi","nvidia.com/gpu":"8""#);
    let node_item = &ok[ok.find("\"items\":[").unwrap() + 9..ok.len() - 2];
    let v2 = |name: &str| {
        format!(
            r#"{{"apiVersion":"v2","kind":"Pod","metadata":{{"name":"{name}","namespace":"ml"}},"spec":{{}}}}"#
        )
    };
    let versions = dir.path().join("versions.json");
    std::fs::write(&versions, list(&[node_item.to_string(), v2("a"), v2("b")])).unwrap();
    let o = run(&["plan", "--snapshot", versions.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    for name in ["Pod ml/a", "Pod ml/b"] {
        let line =
            o.stderr.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("{name}: {}", o.stderr));
        assert!(line.contains("versions.json items[") && line.contains(r#"apiVersion "v2""#), "{line}");
    }
    // A node of a group with another (unknown) instance type, and a MIG layout the GPU has no
    // profile for: each named, with the node and the value.
    let odd = dir.path().join("odd.json");
    let stray = node(
        r#""gpuscale.io/node-group":"gpu-a100-mig","node.kubernetes.io/instance-type":"x9.mega""#,
        r#""cpu":"8","memory":"32Gi""#,
    )
    .replace("gpu-1", "stray");
    let mig = node(
        r#""nvidia.com/gpu.product":"NVIDIA-A100-SXM4-40GB","nvidia.com/mig.config":"all-1g.80gb""#,
        r#""cpu":"96","memory":"1100Gi","nvidia.com/gpu":"8""#,
    );
    let item = |l: &str| l[l.find("\"items\":[").unwrap() + 9..l.len() - 2].to_string();
    std::fs::write(&odd, list(&[item(&stray), item(&mig)])).unwrap();
    let o = run(&["plan", "--snapshot", odd.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // (Loading warnings go to stderr, the plan's own with the plan.)
    let out = format!("{}{}", o.stderr, o.stdout);
    let said = |words: &[&str]| out.lines().any(|l| words.iter().all(|w| l.contains(w)));
    assert!(said(&["Node stray", "\"x9.mega\" (not in the catalog)", "gpu-a100-mig"]), "{out}");
    assert!(said(&["Node gpu-1", "nvidia.com/mig.config", "all-1g.80gb", "no MIG profile"]), "{out}");
    // The same key twice: the last value is the one read, on the fast path (a List item's
    // duplicate field) and within a map alike.
    let twice = |first: &str, last: &str| {
        let n = format!(
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"gpu-1"}},"status":{{"allocatable":{{"nvidia.com/gpu":"{first}"}}}},"status":{{"allocatable":{{"cpu":"96","memory":"1100Gi","nvidia.com/gpu":"{last}"}},"conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
        );
        let p = dir.path().join(format!("dup-{first}-{last}.json"));
        std::fs::write(&p, list(&[n])).unwrap();
        run(&["plan", "--snapshot", p.to_str().unwrap(), "--providers", PROVIDERS])
    };
    let o = twice("1000000000", "8");
    assert_eq!(o.code, Some(0), "the last value (8 GPUs) is read: {}", o.stderr);
    let o = twice("8", "1000000000");
    assert_eq!(o.code, Some(2), "the last value (a billion GPUs) is read: {}", o.stderr);
    assert!(o.stderr.contains("1000000000"), "{}", o.stderr);
}

/// Provider and gpuscale configs: counts, prices and regions past what any cloud has are
/// refused with exit 2 naming the file, field and value; an empty config file is refused.
#[test]
fn configs_past_any_real_cloud_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = "examples/snapshots/mixed-gpu-cluster.json";
    let account = |region: &str, group: &str| {
        format!(
            "accounts:\n  - name: a\n    provider: aws\n    region: {region}\n    credentials: {{profile: p}}\n    nodeGroups:\n      - name: g\n        zones: [{region}a]\n        minSize: 0\n        maxSize: 4\n{group}"
        )
    };
    let spec = |gpus: u64, price: &str| {
        format!(
            "        instanceType: custom.big\n        instanceSpec: {{vcpu: 96, memoryGiB: 1024, gpus: {gpus}, gpuModel: H100-80GB, price: {{onDemand: {price}}}}}\n"
        )
    };
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "ten million GPUs",
            account("us-east-1", &spec(10_000_000, "98.32")),
            vec!["instanceSpec.gpus", "10000000"],
        ),
        (
            "a price of 1e308",
            account("us-east-1", &spec(8, "1e308")),
            vec!["instanceSpec.price.onDemand", "per hour"],
        ),
        (
            "region mars-1",
            account("mars-1", "        instanceType: p5.48xlarge\n"),
            vec!["accounts[0].region", "mars-1", "not a aws region"],
        ),
    ];
    for (name, text, words) in &cases {
        let p = dir.path().join("providers.yaml");
        std::fs::write(&p, text).unwrap();
        let o = run(&["plan", "--snapshot", snapshot, "--providers", p.to_str().unwrap()]);
        assert_eq!(o.code, Some(2), "{name}: {}", o.stderr);
        assert!(o.stderr.contains("providers.yaml"), "{name}: {}", o.stderr);
        for w in words {
            assert!(o.stderr.contains(w), "{name}: {w:?} not in: {}", o.stderr);
        }
        assert!(
            o.max_rss_kib < MAX_RSS_KIB && o.wall < MAX_WALL,
            "{name}: {} KiB {:?}",
            o.max_rss_kib,
            o.wall
        );
    }
    let empty = dir.path().join("gpuscale.yaml");
    std::fs::write(&empty, "").unwrap();
    let o =
        run(&["plan", "--snapshot", snapshot, "--providers", PROVIDERS, "--config", empty.to_str().unwrap()]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(
        o.stderr.contains("gpuscale.yaml") && o.stderr.contains("the config file is empty"),
        "{}",
        o.stderr
    );
}

/// `kubectl get -o yaml` of a real-shaped cluster plans exactly as its `-o json` does, and
/// costs at most its text twice more: YAML is transcoded to JSON event by event, never held as
/// a tree of events or values.
#[test]
fn a_yaml_cluster_plans_as_its_json_does_within_three_times_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = run(&["generate", "--nodes", "300", "--seed", "7", "--out", out]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let json_path = dir.path().join("cluster.json");
    let providers = dir.path().join("providers.yaml");
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let yaml_path = dir.path().join("cluster.yaml");
    std::fs::write(&yaml_path, serde_yaml::to_string(&value).unwrap()).unwrap();
    drop(value);
    let plan = |path: &Path| {
        run(&[
            "plan",
            "--snapshot",
            path.to_str().unwrap(),
            "--providers",
            providers.to_str().unwrap(),
            "--output",
            "json",
        ])
    };
    let (json, yaml) = (plan(&json_path), plan(&yaml_path));
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert_eq!(yaml.code, Some(0), "{}", yaml.stderr);
    assert!(json.stdout.contains("\"placements\": [\n    {"), "no placements: {}", json.stdout);
    // (Warnings name the file.)
    assert_eq!(
        yaml.stdout.replace("cluster.yaml", "cluster.json"),
        json.stdout,
        "the YAML snapshot planned differently"
    );
    let yaml_kib = std::fs::metadata(&yaml_path).unwrap().len() as i64 / 1024;
    println!(
        "JSON {} KiB peak, {} ms; YAML ({yaml_kib} KiB) {} KiB peak, {} ms",
        json.max_rss_kib,
        json.wall.as_millis(),
        yaml.max_rss_kib,
        yaml.wall.as_millis()
    );
    // Its text and its JSON text, at most, beyond what planning the same cluster from JSON takes
    // (serde_yaml's events and value tree took six times as much again).
    let ceiling = json.max_rss_kib + 2 * yaml_kib;
    assert!(yaml.max_rss_kib < ceiling, "YAML peak RSS {} KiB over {ceiling} KiB", yaml.max_rss_kib);
}
