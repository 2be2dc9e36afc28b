//! `gpuscale plan` of a live cluster: a real kube-apiserver holding a real-shaped cluster (from
//! `gpuscale generate`, with a node whose drain has not evicted anything yet and a Ready node
//! whose device plugin advertises only half its GPUs). The plan read live (`--kubeconfig`,
//! `--context`, or found through `KUBECONFIG`) must equal the plan of the same objects exported as
//! `kubectl get nodes,pods,pdb -A -o json` exports them, and show both controller views (the drain
//! as before it, the half-advertised node still starting).

use crate::controlplane;
use crate::dra;

use controlplane::{object_path, ControlPlane, Options};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

fn gpuscale(args: &[&str], kubeconfig_env: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuscale"));
    cmd.args(args).env("RUST_LOG", "warn").env_remove("KUBERNETES_SERVICE_HOST");
    match kubeconfig_env {
        Some(path) => cmd.env("KUBECONFIG", path),
        None => cmd.env("KUBECONFIG", "/nonexistent/kubeconfig"),
    };
    cmd.output().expect("runs gpuscale")
}

fn ok(out: Output, what: &str) -> (Value, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: {stderr}");
    (serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not JSON: {e}")), stderr)
}

/// Server-side applies `obj` without what the server owns, then its status through the status
/// subresource (a create ignores status), as the admin.
async fn create(cp: &ControlPlane, item: &Value) {
    let mut obj = item.clone();
    let status = obj.as_object_mut().unwrap().remove("status");
    let meta = obj["metadata"].as_object_mut().unwrap();
    for field in ["resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"] {
        meta.remove(field);
    }
    cp.apply(obj.clone()).await;
    if obj["kind"] == "Node" {
        // The API server's TaintNodesByCondition admission taints new nodes not-ready; the node
        // lifecycle controller (kube-controller-manager, not running here) lifts it once the node
        // is Ready. Restore the node's own taints, as that controller would.
        let taints = obj["spec"].get("taints").cloned().unwrap_or(Value::Null);
        cp.raw_patch(&object_path(&obj), &json!({"spec": {"taints": taints}})).await;
    }
    let Some(status) = status else { return };
    let patch = json!({
        "apiVersion": obj["apiVersion"], "kind": obj["kind"],
        "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]},
        "status": status,
    });
    let path = format!("{}/status?fieldManager=test&force=true", object_path(&obj));
    let request = http::Request::builder()
        .method("PATCH")
        .uri(&path)
        .header("Content-Type", "application/apply-patch+yaml")
        .body(serde_json::to_vec(&patch).unwrap())
        .unwrap();
    cp.admin.request::<Value>(request).await.unwrap_or_else(|e| panic!("apply {path}: {e}"));
}

const CORE_KINDS: &[(&str, &str, &str)] = &[
    ("/api/v1/nodes", "v1", "Node"),
    ("/api/v1/pods", "v1", "Pod"),
    ("/apis/policy/v1/poddisruptionbudgets", "policy/v1", "PodDisruptionBudget"),
];

const DRA_KINDS: &[(&str, &str, &str)] = &[
    ("/apis/resource.k8s.io/v1/resourceclaims", "resource.k8s.io/v1", "ResourceClaim"),
    ("/apis/resource.k8s.io/v1/resourceclaimtemplates", "resource.k8s.io/v1", "ResourceClaimTemplate"),
    ("/apis/resource.k8s.io/v1/resourceslices", "resource.k8s.io/v1", "ResourceSlice"),
    ("/apis/resource.k8s.io/v1/deviceclasses", "resource.k8s.io/v1", "DeviceClass"),
];

/// What `kubectl get <kinds> -A -o json` prints: one List, each item with its apiVersion and
/// kind, in the server's order per resource.
async fn kubectl_export(cp: &ControlPlane, kinds: &[&[(&str, &str, &str)]]) -> Value {
    let mut items = Vec::new();
    for &(path, api_version, kind) in kinds.iter().copied().flatten() {
        let list = cp.raw("GET", path, None).await.unwrap_or_else(|e| panic!("GET {path}: {e}"));
        for mut item in list["items"].as_array().cloned().unwrap_or_default() {
            item["apiVersion"] = json!(api_version);
            item["kind"] = json!(kind);
            items.push(item);
        }
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_of_the_live_cluster_equals_plan_of_its_kubectl_export() {
    let dir = tempfile::tempdir().unwrap();
    let generated = dir.path().join("generated");
    let out = gpuscale(
        &[
            "generate",
            "--nodes",
            "24",
            "--running",
            "160",
            "--pending",
            "40",
            "--seed",
            "5",
            "--out",
            generated.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "generate: {}", String::from_utf8_lossy(&out.stderr));
    let providers = generated.join("providers.yaml");
    let mut cluster: Value =
        serde_json::from_slice(&std::fs::read(generated.join("cluster.json")).unwrap()).unwrap();
    let items = cluster["items"].as_array_mut().unwrap();

    // Two nodes the controller sees differently from their raw objects: one whose drain has not
    // evicted anything (planned as before the drain), one advertising 4 of its 8 GPUs (registered
    // moments ago, so still starting).
    let h100: Vec<usize> = (0..items.len())
        .filter(|&i| {
            items[i]["kind"] == "Node" && items[i]["metadata"]["labels"]["gpuscale.io/node-group"] == "h100"
        })
        .collect();
    assert!(h100.len() >= 2, "the generator made {} H100 nodes", h100.len());
    let (draining, half) = (h100[0], h100[1]);
    let draining_name = items[draining]["metadata"]["name"].as_str().unwrap().to_string();
    let half_name = items[half]["metadata"]["name"].as_str().unwrap().to_string();
    let d = &mut items[draining];
    d["metadata"]["annotations"]["gpuscale.io/drain-started-at"] = json!("2026-01-01T00:00:00Z");
    d["metadata"]["annotations"]["gpuscale.io/drain-reason"] = json!("empty");
    d["spec"]["unschedulable"] = json!(true);
    d["spec"]["taints"] = json!([{"key": "gpuscale.io/disrupting", "value": "true", "effect": "NoSchedule"}]);
    let h = &mut items[half];
    assert_eq!(h["status"]["allocatable"]["nvidia.com/gpu"], "8", "{h}");
    h["status"]["allocatable"]["nvidia.com/gpu"] = json!("4");
    h["status"]["capacity"]["nvidia.com/gpu"] = json!("4");
    let original = dir.path().join("original.json");
    std::fs::write(&original, serde_json::to_vec(&cluster).unwrap()).unwrap();

    let cp = ControlPlane::start(Options { scheduler: false, ..Default::default() }).await;
    let mut namespaces = BTreeSet::new();
    for item in cluster["items"].as_array().unwrap() {
        if let Some(ns) = item["metadata"]["namespace"].as_str() {
            if namespaces.insert(ns.to_string()) {
                cp.ensure_namespace(ns).await;
            }
        }
        create(&cp, item).await;
    }
    let kubeconfig = cp.admin_kubeconfig.clone();
    let kc = kubeconfig.to_str().unwrap();
    let p = providers.to_str().unwrap();

    let (live, stderr) =
        ok(gpuscale(&["plan", "--kubeconfig", kc, "--providers", p, "-o", "json"], None), "live");
    assert!(stderr.contains(&format!("the live cluster at {}", cp.url)), "{stderr}");
    let export = dir.path().join("export.json");
    std::fs::write(&export, serde_json::to_vec_pretty(&kubectl_export(&cp, &[CORE_KINDS]).await).unwrap())
        .unwrap();
    let (exported, stderr) = ok(
        gpuscale(&["plan", "--snapshot", export.to_str().unwrap(), "--providers", p, "-o", "json"], None),
        "export",
    );
    assert!(!stderr.contains("live cluster"), "{stderr}");
    assert_eq!(live, exported, "live plan vs plan of the kubectl export");

    // Found as kubectl finds it, and by context.
    let (found, stderr) =
        ok(gpuscale(&["plan", "--providers", p, "-o", "json"], Some(&kubeconfig)), "KUBECONFIG");
    assert!(stderr.contains("the live cluster at"), "{stderr}");
    assert_eq!(found, live);
    let (by_context, stderr) = ok(
        gpuscale(&["plan", "--context", "admin@test", "--providers", p, "-o", "json"], Some(&kubeconfig)),
        "--context",
    );
    assert!(stderr.contains("context admin@test"), "{stderr}");
    assert_eq!(by_context, live);
    let bad = gpuscale(&["plan", "--context", "nope", "--providers", p], Some(&kubeconfig));
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--context nope"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // The plan is about this cluster: its pending pods, both controller views.
    let pending = cluster["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "Pod" && i["spec"]["nodeName"].is_null())
        .count();
    assert_eq!(planned_pods(&live).len(), pending, "{live:#}");
    let warnings: Vec<&str> = live["warnings"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with(&format!("Node {half_name}: starting (advertises 4 of the 8 GPUs"))),
        "{warnings:#?}"
    );
    // The drained node is planned as before its drain (not cordoned), as `gpuscale run` plans
    // it: pending pods may go there.
    let to_drained =
        live["placements"].as_array().unwrap().iter().filter(|p| p["node"] == draining_name.as_str()).count();
    assert!(to_drained > 0, "no pending pod placed on {draining_name}: {live:#}");

    // The file the objects came from plans the same cluster: the same cost now and the same
    // pending pods. (Which pod lands where may differ: pending pods of one priority are placed in
    // input order, and the file's order is not the API server's.)
    let (from_file, _) = ok(
        gpuscale(&["plan", "--snapshot", original.to_str().unwrap(), "--providers", p, "-o", "json"], None),
        "file",
    );
    assert_eq!(live["costBeforePerHourUsd"], from_file["costBeforePerHourUsd"]);
    assert_eq!(planned_pods(&live), planned_pods(&from_file));
}

/// `gpuscale plan` of the live cluster on `cp` with `args` (providers, config), which must equal
/// the plan of the same objects as `kubectl get <kinds> -A -o json` exports them; returns it.
async fn live_equals_export(
    cp: &ControlPlane,
    dir: &Path,
    kinds: &[&[(&str, &str, &str)]],
    args: &[&str],
) -> Value {
    let kc = cp.admin_kubeconfig.to_str().unwrap().to_string();
    let live_args: Vec<&str> =
        ["plan", "--kubeconfig", kc.as_str()].into_iter().chain(args.iter().copied()).collect();
    let (live, _) = ok(gpuscale(&[live_args.as_slice(), &["-o", "json"]].concat(), None), "live");
    let export = dir.join("export.json");
    std::fs::write(&export, serde_json::to_vec_pretty(&kubectl_export(cp, kinds).await).unwrap()).unwrap();
    let snapshot_args: Vec<&str> =
        ["plan", "--snapshot", export.to_str().unwrap()].into_iter().chain(args.iter().copied()).collect();
    let (exported, _) = ok(gpuscale(&[snapshot_args.as_slice(), &["-o", "json"]].concat(), None), "export");
    assert_eq!(live, exported, "live plan vs plan of the kubectl export");
    live
}

/// Every pending pod the plan accounts for: placed, scaled for, or unschedulable.
fn planned_pods(plan: &Value) -> BTreeSet<String> {
    let list = |key: &str| plan[key].as_array().cloned().unwrap_or_default();
    let mut pods: BTreeSet<String> =
        list("placements").iter().map(|p| p["pod"].as_str().unwrap().to_string()).collect();
    for s in list("scaleUps") {
        pods.extend(s["pods"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()));
    }
    pods.extend(list("unschedulable").iter().map(|u| u["pod"].as_str().unwrap().to_string()));
    pods
}

/// Pods asking for GPUs through DRA claims, on nodes offering them through ResourceSlices (as
/// NVIDIA's DRA driver publishes them): read live, the claims, templates, slices and classes
/// give the plan the export of `kubectl get nodes,pods,pdb,resourceclaims,resourceclaimtemplates,
/// resourceslices,deviceclasses -A -o json` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claims_are_planned_live_as_from_the_kubectl_export() {
    use dra::*;
    let mut objects = device_classes();
    objects.extend([
        node("h100-a", H100, "h100", 8, 0),
        node("l4-a", L4, "l4", 4, 0),
        slice("h100-a", gpus(8, H100)),
        slice("l4-a", gpus(4, L4)),
        template("four-any", "gpu.nvidia.com", 4, &[]),
        template(
            "eight-h100",
            "gpu.nvidia.com",
            8,
            &["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"],
        ),
        // Five of h100-a's GPUs are a running pod's.
        allocated(
            claim("busy", "gpu.nvidia.com", 5),
            "h100-a",
            &["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"],
            "run",
        ),
        bound(pod("run", "busy", false), "h100-a"),
        pod("want4", "four-any", true),
        pod("want8", "eight-h100", true),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 16, targetSize: 0, dra: {}}
      - {name: l4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 16, targetSize: 0, dra: {}}
"#,
    )
    .unwrap();
    let cp = ControlPlane::start(Options { scheduler: false, ..Default::default() }).await;
    cp.ensure_namespace("ml").await;
    for o in &objects {
        create(&cp, o).await;
    }
    let p = providers.to_str().unwrap();
    let live = live_equals_export(&cp, dir.path(), &[CORE_KINDS, DRA_KINDS], &["--providers", p]).await;
    // What the plan says (so an agreement on nothing cannot pass): four GPUs only the L4 node
    // has free; eight H100s no existing node has, so one more H100 node.
    let placed: Vec<(&str, &str)> = live["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pod"].as_str().unwrap(), p["node"].as_str().unwrap()))
        .collect();
    assert!(placed.contains(&("ml/want4", "l4-a")), "{live:#}");
    let ups: Vec<(&str, u64)> = live["scaleUps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["group"].as_str().unwrap(), s["to"].as_u64().unwrap() - s["from"].as_u64().unwrap()))
        .collect();
    assert_eq!(ups, vec![("sim/h100", 1)], "{live:#}");
    assert!(live["scaleUps"][0]["pods"].as_array().unwrap().contains(&json!("ml/want8")), "{live:#}");
}

fn ago(seconds: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now - seconds).unwrap().to_string()
}

/// The node lifecycle (#45) read live from a real API server: the README's mixed cluster with a
/// node NotReady for a month, a Ready node whose device plugin advertises no GPUs, and a node
/// being deleted (a finalizer holds it). The live plan equals the plan of the export, says each state and why,
/// gives the NotReady and the deleted node no pods, and plans the Ready mixed-MIG A100 node with
/// what it advertises (its free 2g instance takes the pending 2g pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_read_live_is_the_lifecycle_of_the_export() {
    const NOT_READY: &str = "ip-10-0-61-9.ec2.internal";
    const REGRESSED: &str = "ip-10-0-52-88.ec2.internal";
    const DELETING: &str = "ip-10-0-21-15.ec2.internal";
    const MIXED_MIG: &str = "ip-10-0-12-34.ec2.internal";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cluster: Value = serde_json::from_slice(
        &std::fs::read(root.join("examples/snapshots/mixed-gpu-cluster.json")).unwrap(),
    )
    .unwrap();
    let items = cluster["items"].as_array_mut().unwrap();
    // PodGroups need the coscheduling CRD, which this control plane does not serve.
    items.retain(|o| o["kind"] != "PodGroup");
    items.retain(|o| !(o["kind"] == "Pod" && o["spec"]["nodeName"] == REGRESSED));
    for o in items.iter_mut().filter(|o| o["kind"] == "Node") {
        match o["metadata"]["name"].as_str().unwrap() {
            NOT_READY => {
                o["status"]["conditions"] = json!([{"type": "Ready", "status": "False", "reason": "NodeStatusUnknown",
                    "lastHeartbeatTime": ago(30 * 86_400), "lastTransitionTime": ago(30 * 86_400)}]);
                o["spec"]["taints"].as_array_mut().unwrap().extend([
                    json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}),
                    json!({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}),
                ]);
            }
            REGRESSED => {
                o["status"]["allocatable"]["nvidia.com/gpu"] = json!("0");
                o["status"]["capacity"]["nvidia.com/gpu"] = json!("0");
            }
            DELETING => o["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]),
            _ => {}
        }
    }
    let cp = ControlPlane::start(Options { scheduler: false, ..Default::default() }).await;
    // The example's pods name PriorityClasses, which admission requires to exist.
    let mut classes = std::collections::BTreeMap::new();
    for pod in cluster["items"].as_array().unwrap().iter().filter(|o| o["kind"] == "Pod") {
        if let Some(class) = pod["spec"]["priorityClassName"].as_str() {
            classes.insert(class.to_string(), pod["spec"]["priority"].as_i64().unwrap_or(0));
        }
    }
    for (name, value) in classes {
        cp.apply(json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}))
            .await;
    }
    let mut namespaces = BTreeSet::new();
    for item in cluster["items"].as_array().unwrap() {
        if let Some(ns) = item["metadata"]["namespace"].as_str() {
            if namespaces.insert(ns.to_string()) {
                cp.ensure_namespace(ns).await;
            }
        }
        create(&cp, item).await;
    }
    cp.raw("DELETE", &format!("/api/v1/nodes/{DELETING}"), None).await.expect("delete the node");
    let dir = tempfile::tempdir().unwrap();
    let providers = root.join("examples/providers/simulated.yaml");
    let p = providers.to_str().unwrap();
    // The API server stamps every node as registered now: a one-second registration time makes
    // them as old as the example's (a node registering now is `plan_of_the_live_cluster_…`'s).
    let config = dir.path().join("gpuscale.yaml");
    std::fs::write(&config, "controller:\n  registrationTimeoutSeconds: 1\n").unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let c = config.to_str().unwrap();
    let live = live_equals_export(&cp, dir.path(), &[CORE_KINDS], &["--providers", p, "--config", c]).await;

    let warnings: Vec<&str> = live["warnings"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for said in [
        format!("Node {NOT_READY}: unready (NotReady since "),
        format!("Node {REGRESSED}: unready (Ready, but its device plugin advertises no GPUs"),
        format!("Node {DELETING}: being deleted"),
    ] {
        assert!(warnings.iter().any(|w| w.starts_with(&said)), "{said}: {warnings:#?}");
    }
    assert!(!warnings.iter().any(|w| w.contains(MIXED_MIG)), "{warnings:#?}");
    let on = |node: &str| -> Vec<String> {
        let placements = live["placements"].as_array().unwrap();
        placements
            .iter()
            .filter(|x| x["node"] == node)
            .map(|x| x["pod"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(on(NOT_READY).is_empty() && on(DELETING).is_empty() && on(REGRESSED).is_empty(), "{live:#}");
    assert!(on(MIXED_MIG).iter().any(|pod| pod.starts_with("ml-inference/reranker-")), "{live:#}");
}

/// The EKS case of #45 read live: a p5 whose device plugin is off publishes its 8 GPUs as
/// ResourceSlices, in a group whose config says nothing of DRA. The DRA pod is planned onto the
/// Ready node (not in flight); the 8-GPU device-plugin pod is not planned onto GPUs no device
/// plugin advertises, and nothing is bought for it in a group whose nodes have none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_only_node_read_live_is_ready_dra_capacity() {
    use dra::*;
    let mut objects = device_classes();
    let mut p5 = node("h100-dra", H100, "h100", 8, 0);
    p5["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] = json!("false");
    let plugin = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin8", "namespace": "ml"},
      "spec": {"containers": [{"name": "main", "image": "x", "resources": {
          "requests": {"cpu": "1", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]}});
    objects.extend([
        p5,
        slice("h100-dra", gpus(8, H100)),
        template("four", "gpu.nvidia.com", 4, &[]),
        pod("dra", "four", true),
        plugin,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 16, targetSize: 1}
"#,
    )
    .unwrap();
    let cp = ControlPlane::start(Options { scheduler: false, ..Default::default() }).await;
    cp.ensure_namespace("ml").await;
    for o in &objects {
        create(&cp, o).await;
    }
    let p = providers.to_str().unwrap();
    let live = live_equals_export(&cp, dir.path(), &[CORE_KINDS, DRA_KINDS], &["--providers", p]).await;
    let placements = live["placements"].as_array().unwrap();
    let dra = placements.iter().find(|x| x["pod"] == "ml/dra").unwrap_or_else(|| panic!("{live:#}"));
    assert_eq!(dra["node"], "h100-dra", "{live:#}");
    assert_ne!(dra["nodeInFlight"], true, "{live:#}");
    let unschedulable: Vec<&str> =
        live["unschedulable"].as_array().unwrap().iter().map(|u| u["pod"].as_str().unwrap()).collect();
    assert_eq!(unschedulable, vec!["ml/plugin8"], "{live:#}");
    assert!(live["scaleUps"].as_array().unwrap().is_empty(), "{live:#}");
}
