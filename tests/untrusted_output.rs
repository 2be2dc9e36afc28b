//! What the cluster's objects and a folder's files can do to `plan`'s output: names are escaped
//! one way on every stream (a newline cannot forge a line, ESC cannot reach the terminal), and a
//! manifest folder skips, with one warning each, what holds no Kubernetes objects, and never
//! opens a FIFO or a device.
#![cfg(unix)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SNAPSHOT: &str = "examples/snapshots/mixed-gpu-cluster.json";
const PROVIDERS: &str = "examples/providers/simulated.yaml";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary with a deadline (a hang fails instead of blocking the suite).
fn gpuscale(args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpuscale {args:?} still running after 60 s:\n{}", std::fs::read_to_string(&err).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run { code, stdout: std::fs::read_to_string(out).unwrap(), stderr: std::fs::read_to_string(err).unwrap() }
}

/// The example cluster with its first pending pod renamed `name`, written to `dir`.
fn with_pod_named(dir: &Path, name: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let mut list: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join(SNAPSHOT)).unwrap()).unwrap();
    let pod = list["items"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|i| i["kind"] == "Pod" && i["spec"]["nodeName"].is_null())
        .expect("a pending pod");
    pod["metadata"]["name"] = Value::String(name.into());
    edit(pod);
    let path = dir.join("evil.json");
    std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
    path
}

const EVIL: &str = "evil\nSCALE-UP      prod/gpu-h100 0 → 100\u{1b}[2J\u{202e}";
/// How every stream shows it.
const SHOWN: &str = r"evil\nSCALE-UP      prod/gpu-h100 0 → 100\u{1b}[2J\u{202e}";

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}') && !text.contains("\\x1b"),
        "{what}: a raw or differently escaped ESC:\n{text}"
    );
    for line in text.lines() {
        assert!(!line.starts_with("SCALE-UP      prod"), "{what}: a forged line:\n{text}");
    }
}

/// A pod named with a newline, ESC and a bidirectional override: stdout (the table) and stderr
/// (the warning that the API server would refuse the name, the log lines) show it the same way,
/// and neither has a line it forged; an error that names the pod does as well.
#[test]
fn a_pod_name_is_escaped_the_same_way_on_every_stream() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = with_pod_named(dir.path(), EVIL, |_| {});
    let o = gpuscale(&["plan", "--snapshot", snapshot.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert_clean("stdout", &o.stdout);
    assert_clean("stderr", &o.stderr);
    assert!(o.stdout.contains(SHOWN), "stdout:\n{}", o.stdout);
    // The warning names the pod (its object) and quotes the field's value: both read the same.
    let warning =
        o.stderr.lines().find(|l| l.contains("WARN") && l.contains("metadata.name")).expect(&o.stderr);
    assert_eq!(warning.matches(SHOWN).count(), 2, "{warning}");

    // JSON keeps the exact name (its own escaping is safe).
    let o =
        gpuscale(&["plan", "--snapshot", snapshot.to_str().unwrap(), "--providers", PROVIDERS, "-o", "json"]);
    let plan: Value = serde_json::from_str(&o.stdout).unwrap();
    fn holds(v: &Value, name: &str) -> bool {
        match v {
            Value::String(s) => s.ends_with(name),
            Value::Array(a) => a.iter().any(|v| holds(v, name)),
            Value::Object(m) => m.values().any(|v| holds(v, name)),
            _ => false,
        }
    }
    assert!(holds(&plan, &format!("ml-inference/{EVIL}")) || holds(&plan, EVIL), "{}", o.stdout);

    // An error (a bad quantity) naming the pod: exit 2, one line, the same escaping.
    let bad = with_pod_named(dir.path(), EVIL, |pod| {
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = Value::String("lots".into());
    });
    let o = gpuscale(&["plan", "--snapshot", bad.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert_clean("error", &o.stderr);
    let error = o.stderr.lines().find(|l| l.starts_with("error: ")).expect(&o.stderr);
    assert!(error.contains(SHOWN) && error.contains("lots"), "{error}");
    assert!(o.stdout.is_empty());
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// A folder of manifests next to a package's and a Helm chart's files plans as the manifests
/// alone, with one warning per skipped file; a FIFO and a device in it are never opened.
#[test]
fn a_manifest_folder_skips_what_is_not_kubernetes_objects() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("repo");
    std::fs::create_dir_all(folder.join("chart/templates")).unwrap();
    std::fs::copy(repo().join(SNAPSHOT), folder.join("cluster.json")).unwrap();
    write(
        &folder,
        "package.json",
        r#"{"name": "web", "version": "1.0.0", "dependencies": {"left-pad": "1"}}"#,
    );
    write(&folder, "package-lock.json", r#"{"name": "web", "lockfileVersion": 3, "packages": {}}"#);
    // tsconfig allows comments, which are not JSON.
    write(&folder, "tsconfig.json", "{\n  // strict\n  \"compilerOptions\": {\"strict\": true}\n}\n");
    write(&folder.join("chart"), "Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n");
    write(&folder.join("chart"), "values.yaml", "replicaCount: 2\nimage:\n  tag: latest\n");
    write(&folder.join("chart"), "values-prod.yaml", "replicaCount: 5\n");
    write(
        &folder.join("chart/templates"),
        "deploy.yaml",
        "kind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n",
    );
    // Not a known name, but no document in it is a Kubernetes object.
    write(&folder, "settings.yaml", "logLevel: debug\nfeatures: [a, b]\n---\n- 1\n- 2\n");
    write(&folder, "renovate.json", r#"{"extends": ["config:base"]}"#);
    let fifo = folder.join("pipe.yaml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a plain libc call with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    std::os::unix::fs::symlink("/dev/zero", folder.join("zero.yaml")).unwrap();

    let o = gpuscale(&["plan", "--snapshot", folder.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    for (file, says) in [
        ("package.json", "a package manifest"),
        ("package-lock.json", "a package manifest"),
        ("tsconfig.json", "a TypeScript project config"),
        ("chart/Chart.yaml", "a Helm chart's definition"),
        ("chart/values.yaml", "Helm values"),
        ("chart/values-prod.yaml", "Helm values"),
        ("chart/templates/deploy.yaml", "Helm or Go template"),
        ("settings.yaml", "no document in it is a Kubernetes object"),
        ("renovate.json", "no document in it is a Kubernetes object"),
        ("pipe.yaml", "a FIFO, not a regular file"),
        ("zero.yaml", "a device, not a regular file"),
    ] {
        let path = folder.join(file).display().to_string();
        let lines: Vec<&str> = o.stderr.lines().filter(|l| l.contains(&format!("{path}:"))).collect();
        assert_eq!(lines.len(), 1, "{file}: one warning, not {lines:#?}\n{}", o.stderr);
        assert!(lines[0].contains(says) && lines[0].contains("skipped"), "{file}: {}", lines[0]);
    }
    // The plan is the cluster's alone.
    let alone = gpuscale(&["plan", "--snapshot", SNAPSHOT, "--providers", PROVIDERS]);
    assert_eq!(alone.code, Some(0));
    let actions =
        |out: &str| out.lines().filter(|l| !l.starts_with("WARNING")).collect::<Vec<_>>().join("\n");
    assert_eq!(actions(&o.stdout), actions(&alone.stdout));
    assert!(o.stdout.contains("WARNING       ") && o.stdout.contains("package.json"), "{}", o.stdout);

    // Skipping is for files with no object: a manifest that means to be one still fails, naming
    // file and field, and so does a folder of nothing but skipped files.
    write(&folder, "broken.yaml", "apiVersion: v1\nmetadata:\n  name: web-0\n  namespace: ml\n");
    let o = gpuscale(&["plan", "--snapshot", folder.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("broken.yaml") && o.stderr.contains("kind"), "{}", o.stderr);
    let chart = folder.join("chart");
    let o = gpuscale(&["plan", "--snapshot", chart.to_str().unwrap(), "--providers", PROVIDERS]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("no file in the folder holds Kubernetes objects"), "{}", o.stderr);
}
