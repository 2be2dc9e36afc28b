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
        ("alias bomb", file("laughs.yaml", laughs().into_bytes()), vec!["laughs.yaml", "repetition limit"]),
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
