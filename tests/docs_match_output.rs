//! The README and docs/ state what the program prints: the README's sample plan is lines of the
//! real `plan`, every JSON key the docs name is a key of the real output (and docs/architecture.md
//! lists exactly the keys the types write), the sizes the README gives for `generate` are the
//! ones it writes, and messages print paths as they are.

use gpuscale::model::mig::MigPlacement;
use gpuscale::model::DeviceAssignment;
use gpuscale::planner::{
    IdleGpu, Kept, MigRepartition, PendingPlacement, Plan, Preempt, Replace, RequestOutcome, RequestState,
    ScaleDown, ScaleUp, Unschedulable,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Runs the binary from the repository root as on a fresh machine (no kubeconfig).
fn gpuscale(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .expect("running gpuscale")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Whether `line` is `pattern` where each `…` of the pattern stands for any text.
fn matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || !line[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The README's sample output (the unlabelled block after the `## Two commands` commands) is lines
/// of what `cargo run --release -- plan` prints on a machine without a kubeconfig, in its order;
/// `…` stands for text the README leaves out.
#[test]
fn the_readme_sample_plan_is_the_programs() {
    let readme = read("README.md");
    let section = &readme[readme.find("## Two commands").expect("## Two commands")..];
    let command = section.lines().find(|l| l.contains("-- plan")).expect("the plan command");
    let args: Vec<&str> =
        command.split('#').next().unwrap().split(" -- ").nth(1).unwrap().split_whitespace().collect();
    assert_eq!(args, ["plan"], "{command}");
    // The first code block without a language.
    let (mut open, mut info, mut block) = (false, "", Vec::new());
    for line in section.lines() {
        if let Some(rest) = line.strip_prefix("```") {
            if open && info.is_empty() {
                break;
            }
            (open, info) = (!open, rest.trim());
        } else if open && info.is_empty() && !line.trim().is_empty() {
            block.push(line);
        }
    }
    assert!(block.len() >= 5 && block.last().unwrap().starts_with("COST"), "{block:#?}");
    let out = ok(&gpuscale(&args));
    let lines: Vec<&str> = out.lines().collect();
    let mut at = 0;
    for sample in &block {
        match lines[at..].iter().position(|l| matches(sample, l)) {
            Some(i) => at += i + 1,
            None => panic!("README sample line not printed by `gpuscale plan` (in this order):\n{sample}\n\nthe output:\n{out}"),
        }
    }
    assert!(matches("a … c … e", "a b c d e") && !matches("a … c", "a b d") && !matches("x", "xy"));
}

/// `path` → keys of every object in `value` (array elements as `[]`).
fn keys(value: &Value, path: &str, out: &mut BTreeMap<String, BTreeSet<String>>) {
    match value {
        Value::Object(map) => {
            let set = out.entry(path.to_string()).or_default();
            set.extend(map.keys().cloned());
            for (k, v) in map {
                keys(v, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                keys(item, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// The table of docs/architecture.md's "The plan as JSON and YAML": object path → keys.
fn documented_keys() -> BTreeMap<String, BTreeSet<String>> {
    let doc = read("docs/architecture.md");
    let start = doc.find("### The plan as JSON and YAML").expect("the section");
    let section = &doc[start..];
    let section = &section[..section[4..].find("\n#").map_or(section.len(), |e| e + 4)];
    let ticked = |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    let mut out = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| object")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (object, keys) = (cells[1], cells[2]);
        let paths = if object == "the plan" { vec![String::new()] } else { ticked(object) };
        assert!(!paths.is_empty(), "{row}");
        for p in paths {
            let set: &mut BTreeSet<String> = out.entry(p).or_default();
            set.extend(ticked(keys));
        }
    }
    assert!(out.len() >= 10, "{out:#?}");
    out
}

/// A plan with one of everything: every list one element long (a placement per kind of
/// devices), every optional value set, so that serialising it writes every key the types have.
fn full_plan() -> Plan {
    let place =
        |devices| PendingPlacement { pod: "ml/p".into(), node: "n".into(), devices, node_in_flight: false };
    let mig = MigPlacement { profile: "1g.10gb".into(), start: 0 };
    Plan {
        placements: vec![
            place(DeviceAssignment::None),
            place(DeviceAssignment::Whole { gpus: vec![0] }),
            place(DeviceAssignment::Fraction { gpus: vec![0], milli: 500, memory_mib: 1024 }),
            place(DeviceAssignment::Mig { instances: vec![(0, mig.clone())] }),
            place(DeviceAssignment::Replicas { gpus: vec![0] }),
        ],
        scale_ups: vec![ScaleUp {
            group: "a/g".into(),
            instance_type: "p5.48xlarge".into(),
            from: 1,
            to: 2,
            pods: vec!["ml/p".into()],
            requests: vec!["ml/r".into()],
            reason: "r".into(),
            cost_per_hour: 1,
        }],
        scale_downs: vec![ScaleDown {
            node: "n".into(),
            group: "a/g".into(),
            instance: Some("i-1".into()),
            moves: vec![("ml/p".into(), "m".into())],
            reason: "r".into(),
            saving_per_hour: 1,
        }],
        replacements: vec![Replace {
            node: "n".into(),
            group: "a/g".into(),
            replacement_group: "a/h".into(),
            pods: vec!["ml/p".into()],
            saving_per_hour: 1,
        }],
        unschedulable: vec![Unschedulable { pod: "ml/p".into(), reason: "r".into() }],
        preemptions: vec![Preempt {
            pod: "ml/p".into(),
            node: "n".into(),
            victims: vec!["ml/v".into()],
            reason: "r".into(),
            alternative_cost: Some(1),
        }],
        kept: vec![Kept { node: "n".into(), reason: "r".into() }],
        mig_repartitions: vec![MigRepartition {
            node: "n".into(),
            gpus: vec![0],
            from_layout: vec![vec![mig.clone()]],
            to_layout: vec![vec![mig]],
            disrupted_instances: 0,
            mig_config_label: "all-1g.10gb".into(),
            mig_parted_config: String::new(),
            pods: vec!["ml/p".into()],
            saving_per_hour: 1,
        }],
        idle_gpus: vec![IdleGpu {
            node: "n".into(),
            gpu: 0,
            uuid: "GPU-1".into(),
            pods: vec!["ml/p".into()],
            idle_for: 60,
            reclaimable: false,
            cost_per_hour: 1,
        }],
        provisioning_requests: vec![RequestOutcome {
            request: "ml/r".into(),
            class: "check-capacity.autoscaling.x-k8s.io".into(),
            pods: 1,
            state: RequestState::Provisioned,
            reason: "Provisioned".into(),
            message: "m".into(),
            nodes: vec!["n".into()],
            groups: vec!["a/g".into()],
        }],
        cost_before: 1,
        cost_after: 2,
        warnings: vec!["w".into()],
    }
}

fn camel_case(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_lowercase()) && key.chars().all(|c| c.is_ascii_alphanumeric())
}

/// docs/architecture.md lists exactly the keys the plan's types write, all camelCase, objects
/// with named fields (no tuples); the real `-o json` and `-o yaml` of the example snapshots write
/// no other key; and every `…PerHourUsd` key the README and docs name is one of them.
#[test]
fn plan_json_keys_are_the_documented_ones() {
    let documented = documented_keys();
    let mut typed = BTreeMap::new();
    let full = serde_json::to_value(full_plan()).unwrap();
    keys(&full, "", &mut typed);
    assert_eq!(documented, typed, "docs/architecture.md's plan keys (left) against the types' (right)");
    for (path, set) in &typed {
        for k in set {
            assert!(camel_case(k), "{path}: key {k:?} is not camelCase");
        }
    }
    // No tuples: an array of arrays only where the docs say so (a MIG layout per GPU).
    fn no_tuples(v: &Value, path: &str) {
        match v {
            Value::Array(items) => {
                for item in items {
                    if item.is_array() {
                        assert!(path.ends_with("Layout"), "{path}: an array of arrays {v}");
                    }
                    no_tuples(item, &format!("{path}[]"));
                }
            }
            Value::Object(map) => map.iter().for_each(|(k, v)| no_tuples(v, &format!("{path}.{k}"))),
            _ => {}
        }
    }
    no_tuples(&full, "");

    let all: BTreeSet<&String> = documented.values().flatten().collect();
    let mut seen = BTreeMap::new();
    for (snapshot, providers) in [
        ("examples/snapshots/mixed-gpu-cluster.json", "examples/providers/simulated.yaml"),
        ("examples/snapshots/gpu-telemetry.json", "examples/providers/gpu-telemetry.yaml"),
        ("examples/snapshots/provisioning-requests.json", "examples/providers/simulated.yaml"),
    ] {
        let json: Value = serde_json::from_str(&ok(&gpuscale(&[
            "plan",
            "--snapshot",
            snapshot,
            "--providers",
            providers,
            "-o",
            "json",
        ])))
        .unwrap();
        let yaml: Value = serde_yaml::from_str(&ok(&gpuscale(&[
            "plan",
            "--snapshot",
            snapshot,
            "--providers",
            providers,
            "-o",
            "yaml",
        ])))
        .unwrap();
        let (mut j, mut y) = (BTreeMap::new(), BTreeMap::new());
        keys(&json, "", &mut j);
        keys(&yaml, "", &mut y);
        assert_eq!(j, y, "{snapshot}: -o json and -o yaml write the same keys");
        for (path, set) in j {
            let doc = documented.get(&path).unwrap_or_else(|| panic!("{snapshot}: {path} is not documented"));
            assert!(
                set.is_subset(doc),
                "{snapshot}: {path}: {:?} undocumented",
                set.difference(doc).collect::<Vec<_>>()
            );
            seen.entry(path).or_insert_with(BTreeSet::new).extend(set);
        }
    }
    // The examples exercise the plan's main parts (so the check above checks something).
    for path in ["", "placements[]", "placements[].devices", "scaleUps[]", "scaleDowns[].moves[]", "kept[]"] {
        assert!(seen.contains_key(path), "no example writes {path}: {seen:#?}");
    }
    assert!(seen[""].contains("costAfterPerHourUsd") && seen["scaleDowns[].moves[]"].contains("toNode"));

    let mut files = vec!["README.md".to_string()];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    let mut named = 0;
    for file in &files {
        let text = read(file);
        for word in text.split('`').skip(1).step_by(2) {
            if word.ends_with("PerHourUsd") && camel_case(word) {
                assert!(all.contains(&word.to_string()), "{file}: `{word}` is not a key of the plan's JSON");
                named += 1;
            }
        }
    }
    assert!(named >= 2, "the README names the plan's cost keys");
}

/// Thousands separators out, so that `6,000` in the README reads as the program's `6000`.
fn plain(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    c.iter()
        .enumerate()
        .filter(|&(i, &ch)| {
            !(ch == ','
                && i > 0
                && c[i - 1].is_ascii_digit()
                && c.get(i + 1).is_some_and(char::is_ascii_digit))
        })
        .map(|(_, &ch)| ch)
        .collect()
}

/// The numbers in `s`, in order.
fn numbers(s: &str) -> Vec<u64> {
    plain(s)
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}

/// The README's `generate` line says what it writes (`# (…)` is the program's own summary), and
/// the default size it states is the program's: `--nodes`' default, and pods per node as
/// generated.
#[test]
fn generate_writes_the_sizes_the_readme_states() {
    let readme = read("README.md");
    let line = readme.lines().find(|l| l.starts_with("gpuscale generate ")).expect("a generate command");
    let (command, comment) = line.split_once(" # ").expect("a comment with the sizes");
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out_at = args.iter().position(|a| a == "--out").expect("--out") + 1;
    args[out_at] = dir.path().to_str().unwrap().to_string();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let printed = ok(&gpuscale(&args));
    // wrote <dir>/cluster.json (500 nodes, 5000 running and 1000 pending pods, 33 MiB) and …
    let summary = printed.split_once(" (").and_then(|(_, r)| r.split_once(')')).expect(&printed).0;
    assert_eq!(
        plain(comment.trim()),
        format!("writes {summary}"),
        "README.md: {line}\nthe program: {printed}"
    );
    let [nodes, running, pending, mib] = numbers(summary)[..] else { panic!("{summary}") };
    // The summary is the files'.
    let cluster = std::fs::read(dir.path().join("cluster.json")).unwrap();
    assert_eq!(((cluster.len() as f64) / f64::from(1 << 20)).round() as u64, mib);
    let list: Value = serde_json::from_slice(&cluster).unwrap();
    let items = list["items"].as_array().unwrap();
    let count = |kind: &str| items.iter().filter(|i| i["kind"] == kind).count() as u64;
    assert_eq!((count("Node"), count("Pod")), (nodes, running + pending));
    assert!(dir.path().join("providers.yaml").is_file());

    // "the default is 5,000 GPU nodes and 60,000 pods"
    let at = readme.find("the default is ").expect("the README states generate's default");
    let stated = numbers(&readme[at..at + readme[at..].find(':').unwrap()]);
    let help = ok(&gpuscale(&["generate", "--help"]));
    let nodes_help = help.split("--nodes").nth(1).unwrap();
    let default_nodes = numbers(&nodes_help[nodes_help.find("[default: ").unwrap()..])[0];
    assert_eq!(
        stated,
        [default_nodes, default_nodes * (running + pending) / nodes],
        "{}",
        &readme[at..at + 60]
    );
    assert_eq!((running + pending) % nodes, 0, "pods scale with --nodes");
}

/// Messages name a path once, as it is: `simulate` joins its output folder and file names (no
/// `out//curve.csv`), and a kubeconfig that cannot be read is named once, unquoted.
#[test]
fn paths_in_messages_are_written_once_and_joined() {
    let dir = tempfile::tempdir().unwrap();
    let out = format!("{}/", dir.path().join("out").display());
    let o = gpuscale(&[
        "simulate",
        "--nodes",
        "tests/data/tenancy-openb-sample-nodes.csv",
        "--pods",
        "tests/data/tenancy-openb-sample-pods.csv",
        "--seeds",
        "1",
        "--policy",
        "gpuscale",
        "--out",
        &out,
    ]);
    ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let curve = dir.path().join("out").join("curve.csv");
    assert!(curve.is_file(), "{stderr}");
    assert!(stderr.contains(&format!("wrote {}", curve.display())) && !stderr.contains("//"), "{stderr}");

    let missing = dir.path().join("no-such-kubeconfig");
    let missing = missing.to_str().unwrap();
    for args in [
        vec!["plan", "--kubeconfig", missing],
        #[cfg(feature = "controller")]
        vec!["run", "--providers", "examples/providers/simulated.yaml", "--dry-run"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
            .args(&args)
            .env("KUBECONFIG", missing)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .current_dir(repo())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        if cfg!(feature = "controller") {
            assert_eq!(stderr.matches(missing).count(), 1, "{args:?}: {stderr}");
            assert!(!stderr.contains("'\"") && !stderr.contains("\"'"), "{args:?}: {stderr}");
        }
    }
}
