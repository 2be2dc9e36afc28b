//! The `gpuscale` binary as users run it.

use std::path::Path;
use std::process::Command;

/// Runs gpuscale where no kubeconfig is found (`KUBECONFIG` names no file, so `~/.kube/config`
/// is not read either): `plan` without `--snapshot` plans the embedded example, as on a fresh machine.
fn gpuscale(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs gpuscale")
}

const SIMULATED: &str = "examples/providers/simulated.yaml";
const EXAMPLE: &str = "examples/snapshots/mixed-gpu-cluster.json";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn plan_with_no_arguments_shows_a_real_plan_of_the_example_cluster() {
    let out = gpuscale(&["plan"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("SCALE-UP      sim/gpu-h100"), "{stdout}");
    assert!(stdout.contains("COST "), "{stdout}");
}

/// The real-cluster path: a cloud account's group sizes (and so the cost) come from the nodes
/// the snapshot holds, a config size that disagrees is a warning, and half of the input is an
/// error rather than a silent mix with the embedded example.
#[test]
fn plan_of_a_snapshot_takes_sizes_and_costs_from_its_nodes() {
    let out = gpuscale(&[
        "plan",
        "--snapshot",
        EXAMPLE,
        "--providers",
        "examples/providers/aws.yaml",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    // Two p4d.24xlarge nodes of prod-aws/gpu-a100-mig at the config's $19.76/h; the example's
    // other nodes belong to groups this account does not declare.
    assert_eq!(plan["costBeforePerHourUsd"], 2.0 * 19.76, "{plan}");
    assert!(!text(&out.stderr).contains("embedded example"));

    let dir = tempfile::tempdir().unwrap();
    let stated = dir.path().join("aws.yaml");
    let config = std::fs::read_to_string("examples/providers/aws.yaml").unwrap();
    std::fs::write(
        &stated,
        config.replace("        maxSize: 8\n", "        maxSize: 8\n        targetSize: 5\n"),
    )
    .unwrap();
    let out = gpuscale(&["plan", "--snapshot", EXAMPLE, "--providers", stated.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(all.contains("targetSize 5, the snapshot holds 2 of its nodes; planning with 2"), "{all}");
    assert!(text(&out.stdout).contains("COST          $39.52/h"), "{}", text(&out.stdout));

    let out = gpuscale(&["plan", "--snapshot", EXAMPLE]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("required arguments were not provided"), "{}", text(&out.stderr));
    // Node groups but no cluster: an error, not the example's cluster with these groups.
    let out = gpuscale(&["plan", "--providers", "examples/providers/aws.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("--providers: no cluster to plan"), "{}", text(&out.stderr));
    let out = gpuscale(&["plan"]);
    assert!(text(&out.stderr).contains("embedded example cluster"), "{}", text(&out.stderr));
}

#[test]
fn plan_json_and_yaml_are_machine_readable() {
    let out = gpuscale(&["plan", "-o", "json"]);
    assert!(out.status.success());
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(plan["scaleUps"][0]["group"], "sim/gpu-h100");
    // Money is decimal dollars with the unit in the field name.
    assert_eq!(plan["scaleUps"][0]["costPerHourUsd"].as_f64(), Some(4.0 * 55.04), "{plan}");
    let out = gpuscale(&["plan", "-o", "yaml"]);
    let plan: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).expect("valid YAML");
    assert!(plan["costAfterPerHourUsd"].as_f64().unwrap() > plan["costBeforePerHourUsd"].as_f64().unwrap());
}

#[test]
fn malformed_snapshot_fails_with_file_object_and_field_and_prints_no_plan() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/snapshots/malformed");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let out = gpuscale(&["plan", "--snapshot", path.to_str().unwrap(), "--providers", SIMULATED]);
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        assert!(out.stdout.is_empty(), "a plan was printed for {}", path.display());
        let err = text(&out.stderr);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(err.contains(name), "error does not name the file: {err}");
    }
    let out = gpuscale(&[
        "plan",
        "--snapshot",
        dir.join("bad-quantity.json").to_str().unwrap(),
        "--providers",
        SIMULATED,
    ]);
    let err = text(&out.stderr);
    assert!(err.contains("status.allocatable.memory") && err.contains("61736Mb"), "{err}");
}

#[test]
fn bad_provider_config_fails_with_field_path_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(
        &path,
        "accounts:\n  - name: a\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      - {name: g, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 3, maxSize: 1}\n",
    )
    .unwrap();
    let out = gpuscale(&["plan", "--snapshot", EXAMPLE, "--providers", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.contains("providers.yaml") && err.contains("accounts[0].nodeGroups[0]"), "{err}");
}

#[test]
fn simulate_writes_curve_summary_and_plot() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/openb");
    assert!(trace.exists(), "openb trace missing at {}", trace.display());
    let out_dir = tempfile::tempdir().unwrap();
    let out = gpuscale(&[
        "simulate",
        "--nodes",
        trace.join("openb_node_list_gpu_node.csv").to_str().unwrap(),
        "--pods",
        trace.join("openb_pod_list_default.csv").to_str().unwrap(),
        "--policy",
        "fgd,gpuscale",
        "--seeds",
        "42-43",
        "--out",
        out_dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("fgd") && stdout.contains("gpuscale") && stdout.contains("ALLOC@130%"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(out_dir.path().join("curve.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("arrived_pct,fgd,gpuscale"));
    assert_eq!(lines.count(), 131, "one row per 1% from 0 to 130");
    let svg = std::fs::read_to_string(out_dir.path().join("allocation.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("gpuscale"));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary[0]["seeds"], serde_json::json!([42, 43]));
}

#[test]
fn simulate_rejects_a_bad_trace_row_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    std::fs::write(&nodes, "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,64000,-1,2,P100\n")
        .unwrap();
    let pods = dir.path().join("pods.csv");
    std::fs::write(&pods, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1000,1,500\n").unwrap();
    let out = gpuscale(&["simulate", "--nodes", nodes.to_str().unwrap(), "--pods", pods.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("nodes.csv") && err.contains("line 3") && err.contains("memory_mib"), "{err}");
}

/// `run --dry-run` takes no part in the election, so it needs no identity: without one it goes
/// on to look for the cluster (and here fails there, on a kubeconfig that does not exist). Logs to
/// a pipe carry no colour codes.
#[cfg(feature = "controller")]
#[test]
fn a_dry_run_needs_no_identity_and_logs_to_a_pipe_have_no_colour() {
    let out = run_with_no_cluster(&["--dry-run"], "trace");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "no cluster here: {stderr}");
    assert!(!stderr.contains("leader-election identity"), "{stderr}");
    assert!(stderr.contains("Kubernetes API server"), "{stderr}");
    assert!(stderr.contains("TRACE kube_client"), "a log line to check: {stderr}");
    assert!(!stderr.contains('\x1b'), "colour codes in piped logs: {stderr:?}");
    // Without --dry-run the identity is still required.
    let out = run_with_no_cluster(&[], "info");
    assert!(text(&out.stderr).contains("leader-election identity"), "{}", text(&out.stderr));
}

/// `gpuscale run` on the simulated account with `extra` flags, where there is no cluster (no
/// in-cluster service, a kubeconfig that does not exist) and no identity in the environment.
#[cfg(feature = "controller")]
fn run_with_no_cluster(extra: &[&str], rust_log: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["run", "--providers", SIMULATED])
        .args(extra)
        .env_remove("HOSTNAME")
        .env_remove("POD_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("RUST_LOG", rust_log)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs gpuscale")
}

/// How often `needle` occurs in `hay`.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

/// A file that cannot be read is named once with its cause once: the error types put the OS error
/// in their message and do not also return it as their `source()`, which `{:#}` would print again.
#[test]
fn a_missing_file_names_its_cause_once() {
    let missing = "/nonexistent/gpuscale-test/missing.yaml";
    let mut cases = vec![
        vec!["plan", "--snapshot", missing, "--providers", SIMULATED],
        vec!["plan", "--snapshot", EXAMPLE, "--providers", missing],
        vec!["plan", "--config", missing],
        vec!["simulate", "--nodes", missing, "--pods", missing],
        vec!["simulate", "--autoscale", "--pods", missing],
    ];
    if cfg!(feature = "controller") {
        cases.push(vec!["run", "--dry-run", "--providers", missing]);
    }
    for args in cases {
        let out = gpuscale(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(count(&err, missing), 1, "{args:?}: the file once: {err}");
        assert_eq!(count(&err, "No such file or directory"), 1, "{args:?}: the cause once: {err}");
    }
}

/// A config error states its position once (serde_yaml's own ` at line L column C` is dropped).
#[test]
fn a_bad_config_names_its_position_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuscale.yaml");
    std::fs::write(&config, "planner:\n  scaleDownUtilisation: 0.3\n").unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&providers, "accounts:\n  - name: a\n    provider: simulated\n    bogus: 1\n").unwrap();
    let syntax = dir.path().join("syntax.yaml");
    std::fs::write(&syntax, "planner: [1, 2\n").unwrap();
    for (args, at) in [
        (vec!["plan", "--config", config.to_str().unwrap()], "gpuscale.yaml:2:3: "),
        (
            vec!["plan", "--snapshot", EXAMPLE, "--providers", providers.to_str().unwrap()],
            "providers.yaml:4:5: ",
        ),
        (vec!["plan", "--config", syntax.to_str().unwrap()], "syntax.yaml:2:1: "),
    ] {
        let out = gpuscale(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(at), "{args:?}: the position leads: {err}");
        assert!(!err.contains(" at line 2 column 3") && !err.contains(" at line 4 column 5"), "{err}");
        assert!(!err.contains(" at line 2 column 1"), "the position once: {err}");
    }
}

/// `run` cannot find a cluster: kube's reason is given once.
#[cfg(feature = "controller")]
#[test]
fn no_cluster_is_reported_once() {
    let out = run_with_no_cluster(&["--dry-run"], "error");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("finding the Kubernetes API server"), "{err}");
    assert_eq!(count(&err, "No such file or directory"), 1, "the cause once: {err}");
}

/// The agent's bind error names the address and the OS error once.
#[cfg(feature = "agent")]
#[test]
fn an_address_in_use_is_reported_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["agent", "--listen", &addr, "--no-annotate"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs gpuscale");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent started on an address in use");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(count(&err, &addr), 1, "{err}");
    assert_eq!(count(&err, "Address already in use"), 1, "the cause once: {err}");
}

/// Runs gpuscale with stderr on a pseudo-terminal and returns what it wrote there.
#[cfg(all(unix, feature = "controller"))]
fn stderr_on_a_terminal(args: &[&str], no_color: Option<&str>) -> String {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut controller, mut terminal) = (-1, -1);
    // SAFETY: openpty writes two new descriptors, which are owned here from then on.
    let rc = unsafe {
        libc::openpty(
            &mut controller,
            &mut terminal,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and nothing else owns them.
    let (controller, terminal) =
        unsafe { (OwnedFd::from_raw_fd(controller), OwnedFd::from_raw_fd(terminal)) };
    let mut reader = std::fs::File::from(controller);
    let collect = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Reading the controller side ends with EIO once no process holds the terminal side.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuscale"));
    cmd.args(args)
        .env_remove("NO_COLOR")
        .env_remove("HOSTNAME")
        .env_remove("POD_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("RUST_LOG", "trace")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(terminal));
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    let status = cmd.status().expect("runs gpuscale");
    drop(cmd);
    assert!(!status.success(), "no cluster here");
    String::from_utf8_lossy(&collect.join().unwrap()).into_owned()
}

/// Log lines are coloured for a person at a terminal, and not with `NO_COLOR` set (no-color.org:
/// any non-empty value); with stderr on a pipe they never are (the dry-run test above).
#[cfg(all(unix, feature = "controller"))]
#[test]
fn logs_are_coloured_only_on_a_terminal_without_no_color() {
    let args = ["run", "--dry-run", "--providers", SIMULATED];
    let plain = stderr_on_a_terminal(&args, None);
    assert!(plain.contains("kube_client"), "a log line to check: {plain}");
    assert!(plain.contains("\x1b["), "a terminal gets colour: {plain:?}");
    let no_color = stderr_on_a_terminal(&args, Some("1"));
    assert!(no_color.contains("kube_client"), "a log line to check: {no_color}");
    assert!(!no_color.contains('\x1b'), "NO_COLOR=1 turns colour off: {no_color:?}");
    // An empty NO_COLOR is as good as unset.
    assert!(stderr_on_a_terminal(&args, Some("")).contains("\x1b["));
}
