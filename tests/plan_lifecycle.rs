//! Which nodes are capacity, as `gpuscale plan` prints it for real-shaped snapshots (the README's
//! examples, changed the way clusters change): a Ready node is planned with what it advertises, a
//! node NotReady for a month or being deleted is no capacity, a node registered two minutes ago
//! without its GPUs is capacity on its way.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn data(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `gpuscale plan <args> -o json`, which must succeed.
fn plan(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .arg("plan")
        .args(args)
        .args(["-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "plan {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The mixed example changed by `change`, planned with its simulated account.
fn plan_changed(change: impl FnOnce(&mut Vec<Value>)) -> Value {
    let mut cluster: Value =
        serde_json::from_slice(&std::fs::read(data("examples/snapshots/mixed-gpu-cluster.json")).unwrap())
            .unwrap();
    change(cluster["items"].as_array_mut().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.json");
    std::fs::write(&path, serde_json::to_vec(&cluster).unwrap()).unwrap();
    let providers = data("examples/providers/simulated.yaml");
    plan(&["--snapshot", path.to_str().unwrap(), "--providers", providers.to_str().unwrap()])
}

fn warnings(plan: &Value) -> Vec<String> {
    plan["warnings"].as_array().unwrap().iter().filter_map(|w| w.as_str().map(str::to_string)).collect()
}

fn placed_on(plan: &Value, node: &str) -> Vec<String> {
    let placements = plan["placements"].as_array().unwrap();
    placements.iter().filter(|p| p["node"] == node).map(|p| p["pod"].as_str().unwrap().to_string()).collect()
}

fn node_mut<'a>(items: &'a mut [Value], name: &str) -> &'a mut Value {
    items.iter_mut().find(|o| o["kind"] == "Node" && o["metadata"]["name"] == name).unwrap()
}

fn ago(seconds: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now - seconds).unwrap().to_string()
}

#[test]
fn the_embedded_example_plans_its_ready_mig_node_as_ready() {
    let plan = plan(&["--example"]);
    let w = warnings(&plan);
    // Its A100 node runs a mixed 3g/2g/1g layout where the group's config says all-1g: Ready with
    // what it advertises, not capacity on its way.
    assert!(
        !w.iter().any(|w| w.contains("ip-10-0-12-34.ec2.internal: starting") || w.contains("in flight")),
        "{w:#?}"
    );
}

#[test]
fn the_telemetry_example_gets_its_mig_advice_and_buys_nothing() {
    let plan = plan(&[
        "--snapshot",
        data("examples/snapshots/gpu-telemetry.json").to_str().unwrap(),
        "--providers",
        data("examples/providers/gpu-telemetry.yaml").to_str().unwrap(),
    ]);
    assert!(!plan["migRepartitions"].as_array().unwrap().is_empty(), "{plan:#}");
    assert!(plan["scaleUps"].as_array().unwrap().is_empty(), "{plan:#}");
}

/// The node the example's plan puts most pending pods on.
fn busiest_destination() -> String {
    let base = plan_changed(|_| {});
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for p in base["placements"].as_array().unwrap() {
        *counts.entry(p["node"].as_str().unwrap().to_string()).or_default() += 1;
    }
    counts.into_iter().filter(|(n, _)| !n.contains("upcoming")).max_by_key(|(_, c)| *c).unwrap().0
}

#[test]
fn a_node_not_ready_for_a_month_takes_no_pods() {
    let node = busiest_destination();
    let plan = plan_changed(|items| {
        let n = node_mut(items, &node);
        n["status"]["conditions"] = json!([{"type": "Ready", "status": "False", "reason": "NodeStatusUnknown",
            "lastHeartbeatTime": ago(30 * 86_400), "lastTransitionTime": ago(30 * 86_400)}]);
        n["spec"]["taints"].as_array_mut().unwrap().extend([
            json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}),
            json!({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}),
        ]);
    });
    assert!(placed_on(&plan, &node).is_empty(), "{:?}", placed_on(&plan, &node));
    let w = warnings(&plan);
    assert!(w.iter().any(|w| w.starts_with(&format!("Node {node}: unready (NotReady since "))), "{w:#?}");
}

#[test]
fn a_node_registered_two_minutes_ago_without_its_gpus_is_capacity_on_its_way() {
    let node = "ip-10-0-52-88.ec2.internal";
    let plan = plan_changed(|items| {
        items.retain(|o| !(o["kind"] == "Pod" && o["spec"]["nodeName"] == node));
        let n = node_mut(items, node);
        n["metadata"]["creationTimestamp"] = json!(ago(120));
        n["status"]["allocatable"]["nvidia.com/gpu"] = json!("0");
        n["status"]["capacity"]["nvidia.com/gpu"] = json!("0");
    });
    let w = warnings(&plan);
    assert!(
        w.iter()
            .any(|w| w
                .starts_with(&format!("Node {node}: starting (its device plugin advertises no GPUs yet"))),
        "{w:#?}"
    );
    // Never an empty node to remove.
    let downs = plan["scaleDowns"].as_array().unwrap();
    assert!(!downs.iter().any(|d| d["node"] == node), "{downs:#?}");
}

#[test]
fn a_node_being_deleted_is_said_and_leaves_no_phantom_in_its_group() {
    let node = "ip-10-0-21-15.ec2.internal";
    let base = plan_changed(|_| {});
    let upcoming = |p: &Value| {
        p["placements"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["node"].as_str().unwrap().contains("upcoming"))
            .count()
    };
    let plan = plan_changed(|items| {
        node_mut(items, node)["metadata"]["deletionTimestamp"] = json!(ago(10));
    });
    let w = warnings(&plan);
    assert!(w.iter().any(|w| w.starts_with(&format!("Node {node}: being deleted"))), "{w:#?}");
    assert!(placed_on(&plan, node).is_empty());
    assert!(upcoming(&plan) <= upcoming(&base), "a phantom upcoming node took pods: {plan:#}");
}

/// The example's A100 node runs a mixed 3g/2g/1g layout where its group's config says all-1g. It
/// is judged on its merits like any Ready node: kept while its 3g pods have nowhere else to go
/// (the pending 2g pod is placed on its free 2g instance, the only one in the cluster, and the
/// all-1g node's pods move onto its free 1g instances); removed as empty once it runs nothing and
/// no pending pod needs it.
#[test]
fn a_ready_mixed_mig_node_is_kept_or_drained_on_its_merits() {
    const NODE: &str = "ip-10-0-12-34.ec2.internal";
    const ALL_1G: &str = "ip-10-0-14-201.ec2.internal";
    let downs = |p: &Value| p["scaleDowns"].as_array().unwrap().clone();
    let kept = plan_changed(|_| {});
    let placed = placed_on(&kept, NODE);
    assert!(placed.iter().any(|p| p.starts_with("ml-inference/reranker-")), "{placed:?}");
    assert!(!downs(&kept).iter().any(|d| d["node"] == NODE), "{:#?}", downs(&kept));
    assert!(
        kept["placements"].as_array().unwrap().iter().all(|p| p["node"] != NODE || p["nodeInFlight"] != true),
        "{kept:#}"
    );
    let all_1g = downs(&kept).into_iter().find(|d| d["node"] == ALL_1G);
    let moves = all_1g.unwrap_or_else(|| panic!("{:#?}", downs(&kept)))["moves"].to_string();
    assert!(moves.contains(NODE) && moves.contains("embedder-"), "{moves}");

    let runs_nothing = plan_changed(|items| {
        items.retain(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let daemon = o["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet";
            // Its pods, and the pending ones the plan would place on it (the 2g pod, a notebook).
            let lands_here = name.starts_with("reranker-") || name.starts_with("notebook-bob-");
            !(o["kind"] == "Pod" && (o["spec"]["nodeName"] == NODE && !daemon || lands_here))
        });
    });
    let down = downs(&runs_nothing).into_iter().find(|d| d["node"] == NODE);
    let down = down.unwrap_or_else(|| panic!("{:#?}", downs(&runs_nothing)));
    assert!(down["moves"].as_array().is_none_or(|m| m.is_empty()), "{down:#}");
    assert!(!downs(&runs_nothing).iter().any(|d| d["node"] == ALL_1G), "{:#?}", downs(&runs_nothing));
}
