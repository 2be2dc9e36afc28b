//! kube-scheduler as the oracle of `plan`'s feasibility: randomized snapshots (seeded) are loaded
//! into the real API server, the real kube-scheduler decides each pending pod, and every pod's
//! verdict is compared with whether gpuscale's planner places it on an existing node.
//!
//! Each snapshot is isolated from the others in the one cluster: its own namespace (pod affinity
//! and spread count only pods of the pod's namespace), its own zone values, and nodes that carry a
//! `snap` label and taint only its pod selects and tolerates. Each holds one pending pod, so the
//! verdict does not depend on the order pods are scheduled in; the pod and its nodes draw from
//! what kube-scheduler's filters check: resources (cpu, memory, pods, GPUs, EFA), taints and
//! tolerations, cordons, node selectors and required node affinity, host ports, required pod
//! affinity and anti-affinity (both directions), topology spread, and volumes: claims bound to
//! volumes with node affinity or zone labels, unbound `WaitForFirstConsumer` claims with local
//! volumes on some nodes, `ReadWriteOncePod` claims in use, missing claims and claims whose
//! binding is not complete. The test plays the volume controller's part for the claims
//! kube-scheduler binds (no kube-controller-manager runs), so such pods are bound too.
//!
//! Every disagreement is printed one per line with both verdicts and the filters the pod
//! exercises, and fails the test. `GPUSCALE_DIFF_SNAPSHOTS` (default 500) and `GPUSCALE_DIFF_SEED`
//! (default 1) choose the set.

use crate::controlplane;

use controlplane::{ControlPlane, Options};
use futures::StreamExt;
use gpuscale::k8s::SourcedObject;
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The filters a snapshot's pending pod exercises, printed with each disagreement.
#[derive(Debug, Default, Clone)]
struct Uses(BTreeSet<&'static str>);

impl Uses {
    fn add(&mut self, f: &'static str) {
        self.0.insert(f);
    }
}

/// One generated snapshot: its objects and what its pending pod exercises.
struct Snapshot {
    ns: String,
    nodes: Vec<Value>,
    pods: Vec<Value>,
    /// PersistentVolumes and PersistentVolumeClaims, with the status each is to have.
    storage: Vec<Value>,
    pending: String,
    uses: Uses,
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, xs: &'a [T]) -> &'a T {
    &xs[rng.random_range(0..xs.len())]
}

fn generate(i: usize, rng: &mut ChaCha8Rng) -> Snapshot {
    let ns = format!("s{i}");
    let snap_taint = json!({"key": "snap", "value": ns, "effect": "NoSchedule"});
    let mut uses = Uses::default();
    let n_nodes = rng.random_range(1..=4);
    let zones = [format!("{ns}-a"), format!("{ns}-b")];
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    let apps = ["web", "db", "train"];
    for j in 0..n_nodes {
        let name = format!("{ns}-n{j}");
        let zone = pick(rng, &zones).clone();
        let gpus = *pick(rng, &[0, 0, 1, 4, 8]);
        let efa = if rng.random_bool(0.2) { 1 } else { 0 };
        let max_pods = *pick(rng, &[110, 110, 3, 2]);
        let mut taints = vec![snap_taint.clone()];
        if rng.random_bool(0.25) {
            taints.push(json!({"key": "dedicated", "value": "gpu", "effect": pick(rng, &["NoSchedule", "NoExecute"])}));
        }
        let unschedulable = rng.random_bool(0.08);
        let mut alloc = json!({
            "cpu": pick(rng, &["2", "4", "8"]).to_string(),
            "memory": pick(rng, &["4Gi", "16Gi"]).to_string(),
            "pods": max_pods.to_string(),
        });
        if gpus > 0 {
            alloc["nvidia.com/gpu"] = json!(gpus.to_string());
        }
        if efa > 0 {
            alloc["vpc.amazonaws.com/efa"] = json!(efa.to_string());
        }
        nodes.push(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone,
                "pool": pick(rng, &["a", "b"]).to_string(), "snap": ns,
            }},
            "spec": {"taints": taints, "unschedulable": unschedulable},
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        // Existing pods on the node (bound; kube-scheduler counts them whatever their phase).
        let existing = rng.random_range(0..=max_pods.min(3));
        let mut gpus_left = gpus;
        for k in 0..existing {
            let app = *pick(rng, &apps);
            let g = if gpus_left > 0 && rng.random_bool(0.5) { rng.random_range(1..=gpus_left) } else { 0 };
            gpus_left -= g;
            let mut p = pod(&ns, &format!("{name}-p{k}"), app, "500m", "512Mi", g, 0);
            p["spec"]["nodeName"] = json!(name);
            p["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
            if rng.random_bool(0.15) {
                p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080, "hostPort": 8080}]);
            }
            if rng.random_bool(0.15) {
                // An existing pod that repels `train` pods from its node (the symmetric check).
                p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "kubernetes.io/hostname"}]}});
                uses.add("existing-anti-affinity");
            }
            p["status"] = json!({"phase": "Running"});
            pods.push(p);
        }
        if existing as u32 >= max_pods as u32 {
            uses.add("pod-limit");
        }
        if max_pods < 110 {
            uses.add("pods-resource");
        }
    }
    if nodes.iter().any(|n| n["spec"]["unschedulable"] == true) {
        uses.add("unschedulable-node");
    }
    if nodes.iter().any(|n| n["spec"]["taints"].as_array().unwrap().len() > 1) {
        uses.add("taints");
    }

    // The pending pod.
    let gpus = *pick(rng, &[0, 1, 1, 2, 4, 8]);
    let cpu = *pick(rng, &["250m", "1", "3"]);
    let mem = *pick(rng, &["256Mi", "2Gi", "8Gi"]);
    uses.add("cpu");
    uses.add("memory");
    if gpus > 0 {
        uses.add("gpu");
    }
    let efa = if rng.random_bool(0.15) { 1 } else { 0 };
    if efa > 0 {
        uses.add("extended-resource");
    }
    let pending = format!("{ns}-pending");
    let mut p = pod(&ns, &pending, "train", cpu, mem, gpus, efa);
    let mut tolerations =
        vec![json!({"key": "snap", "operator": "Equal", "value": ns, "effect": "NoSchedule"})];
    if rng.random_bool(0.5) {
        tolerations.push(json!({"key": "dedicated", "operator": "Exists"}));
    }
    p["spec"]["tolerations"] = json!(tolerations);
    let mut selector = json!({"snap": ns});
    if rng.random_bool(0.2) {
        selector["pool"] = json!("a");
        uses.add("node-selector");
    }
    p["spec"]["nodeSelector"] = selector;
    let mut affinity = json!({});
    if rng.random_bool(0.2) {
        affinity["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zones[0]]}]}]}});
        uses.add("node-affinity");
    }
    if rng.random_bool(0.2) {
        let key = *pick(rng, &["kubernetes.io/hostname", "topology.kubernetes.io/zone"]);
        affinity["podAntiAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": pick(rng, &apps)}}, "topologyKey": key}]});
        uses.add("pod-anti-affinity");
    }
    if rng.random_bool(0.15) {
        affinity["podAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": pick(rng, &["web", "db"])}}, "topologyKey": "topology.kubernetes.io/zone"}]});
        uses.add("pod-affinity");
    }
    if affinity.as_object().is_some_and(|a| !a.is_empty()) {
        p["spec"]["affinity"] = affinity;
    }
    if rng.random_bool(0.2) {
        p["spec"]["topologySpreadConstraints"] = json!([{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "train"}}}]);
        uses.add("topology-spread");
    }
    if rng.random_bool(0.15) {
        p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080, "hostPort": 8080}]);
        uses.add("host-port");
    }
    let mut storage = Vec::new();
    if rng.random_bool(0.35) {
        let claim = add_volume(&ns, rng, &zones, &nodes, &mut pods, &mut storage, &mut uses);
        p["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
        // A small pod, so that the volume filters decide more often than the resources do.
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "250m", "memory": "256Mi"}});
        p["spec"]["containers"][0].as_object_mut().unwrap().remove("ports");
        for u in ["gpu", "extended-resource", "host-port"] {
            uses.0.remove(u);
        }
    }
    pods.push(p);
    Snapshot { ns, nodes, pods, storage, pending, uses }
}

/// The `WaitForFirstConsumer` class of local volumes every snapshot's unbound claims use.
const LOCAL_CLASS: &str = "diff-local";

fn local_class() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": LOCAL_CLASS},
           "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"})
}

/// A `ReadWriteOnce` volume of `size` in `class`; `claim` reserves it (a bound volume), `phase`
/// is its status.
fn pv(name: &str, class: &str, size: &str, claim: Option<(&str, &str)>, phase: &str) -> Value {
    let mut v = json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": class, "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": format!("/tmp/{name}")}},
        "status": {"phase": phase},
    });
    if let Some((ns, c)) = claim {
        v["spec"]["claimRef"] =
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": c});
    }
    v
}

/// A claim of 5 GiB in `class`; `bound` names its volume and whether the binding is complete.
fn pvc(ns: &str, name: &str, class: &str, mode: &str, bound: Option<(&str, bool)>) -> Value {
    let mut c = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"accessModes": [mode], "storageClassName": class, "resources": {"requests": {"storage": "5Gi"}}},
        "status": {"phase": "Pending"},
    });
    if let Some((volume, complete)) = bound {
        c["spec"]["volumeName"] = json!(volume);
        if complete {
            c["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes"});
            c["status"] = json!({"phase": "Bound", "accessModes": [mode], "capacity": {"storage": "10Gi"}});
        }
    }
    c
}

fn node_affinity(key: &str, value: &str) -> Value {
    json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}})
}

/// Gives the snapshot's pending pod a claim, one of the cases VolumeBinding, VolumeZone and
/// VolumeRestrictions decide; returns the claim's name.
fn add_volume(
    ns: &str,
    rng: &mut ChaCha8Rng,
    zones: &[String; 2],
    nodes: &[Value],
    pods: &mut [Value],
    storage: &mut Vec<Value>,
    uses: &mut Uses,
) -> String {
    let claim = format!("{ns}-data");
    let volume = format!("{ns}-pv");
    let zone = pick(rng, zones).clone();
    let bound = |mode: &str| pvc(ns, &claim, "", mode, Some((&volume, true)));
    match rng.random_range(0..6) {
        0 => {
            let mut v = pv(&volume, "", "10Gi", Some((ns, &claim)), "Bound");
            v["spec"]["nodeAffinity"] = node_affinity("topology.kubernetes.io/zone", &zone);
            storage.extend([v, bound("ReadWriteOnce")]);
            uses.add("volume-node-affinity");
        }
        1 => {
            let mut v = pv(&volume, "", "10Gi", Some((ns, &claim)), "Bound");
            v["metadata"]["labels"] = json!({"topology.kubernetes.io/zone": zone});
            storage.extend([v, bound("ReadWriteOnce")]);
            uses.add("volume-zone");
        }
        2 => {
            for (j, n) in nodes.iter().enumerate() {
                if rng.random_bool(0.7) {
                    let host = n["metadata"]["name"].as_str().unwrap();
                    let size = *pick(rng, &["1Gi", "10Gi", "10Gi"]);
                    let mut v = pv(&format!("{volume}{j}"), LOCAL_CLASS, size, None, "Available");
                    v["spec"]["nodeAffinity"] = node_affinity("kubernetes.io/hostname", host);
                    storage.push(v);
                }
            }
            storage.push(pvc(ns, &claim, LOCAL_CLASS, "ReadWriteOnce", None));
            uses.add("volume-wait-for-first-consumer");
        }
        3 => {
            let mut v = pv(&volume, "", "10Gi", Some((ns, &claim)), "Bound");
            v["spec"]["accessModes"] = json!(["ReadWriteOncePod"]);
            storage.extend([v, bound("ReadWriteOncePod")]);
            if let Some(user) = pods.first_mut() {
                user["spec"]["volumes"] =
                    json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
            }
            uses.add("volume-read-write-once-pod");
        }
        4 => uses.add("volume-missing-claim"),
        _ => {
            storage.extend([
                pv(&volume, "", "10Gi", Some((ns, &claim)), "Available"),
                pvc(ns, &claim, "", "ReadWriteOnce", Some((&volume, false))),
            ]);
            uses.add("volume-binding-incomplete");
        }
    }
    claim
}

/// Plays the volume controller for claims kube-scheduler has bound to a volume (it sets the
/// volume's claimRef and waits for the controller to finish): completes each such binding.
async fn complete_bindings(cp: &ControlPlane) {
    let volumes = cp.raw("GET", "/api/v1/persistentvolumes", None).await.expect("list volumes");
    for v in volumes["items"].as_array().unwrap() {
        let (Some(ns), Some(claim)) =
            (v["spec"]["claimRef"]["namespace"].as_str(), v["spec"]["claimRef"]["name"].as_str())
        else {
            continue;
        };
        if v["status"]["phase"] != "Available" || v["spec"]["storageClassName"] != LOCAL_CLASS {
            continue;
        }
        let name = v["metadata"]["name"].as_str().unwrap();
        let path = format!("/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}");
        cp.raw_patch(
            &path,
            &json!({"metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}}, "spec": {"volumeName": name}}),
        )
        .await;
        cp.raw_patch(&format!("{path}/status"), &json!({"status": {"phase": "Bound"}})).await;
        cp.raw_patch(
            &format!("/api/v1/persistentvolumes/{name}/status"),
            &json!({"status": {"phase": "Bound"}}),
        )
        .await;
    }
}

fn pod(ns: &str, name: &str, app: &str, cpu: &str, mem: &str, gpus: u32, efa: u32) -> Value {
    let mut requests = json!({"cpu": cpu, "memory": mem});
    let mut limits = json!({});
    if gpus > 0 {
        requests["nvidia.com/gpu"] = json!(gpus.to_string());
        limits["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    if efa > 0 {
        requests["vpc.amazonaws.com/efa"] = json!(efa.to_string());
        limits["vpc.amazonaws.com/efa"] = json!(efa.to_string());
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": limits}}],
                 "terminationGracePeriodSeconds": 0},
    })
}

/// gpuscale's verdict: `Ok(node)` when the planner places the pending pod on an existing node,
/// `Err(reason)` otherwise.
fn plan_verdict(s: &Snapshot) -> Result<String, String> {
    let class = local_class();
    let objects: Vec<SourcedObject> = s
        .nodes
        .iter()
        .chain(&s.pods)
        .chain(&s.storage)
        .chain([&class])
        .map(|o| SourcedObject::new(s.ns.clone(), o.clone()))
        .collect();
    let loaded = gpuscale::k8s::convert(&objects).map_err(|e| format!("conversion error: {e}"))?;
    let input = PlanInput {
        snapshot: loaded.snapshot,
        groups: Vec::new(),
        unavailable: Default::default(),
        ..Default::default()
    };
    let settings = PlannerSettings { scale_down: false, consolidation: false, ..Default::default() };
    let plan = planner::plan(&input, &settings);
    let id = format!("{}/{}", s.ns, s.pending);
    if let Some(p) = plan.placements.iter().find(|p| p.pod == id) {
        return Ok(p.node.clone());
    }
    Err(plan.unschedulable.iter().find(|u| u.pod == id).map_or("not placed".into(), |u| u.reason.clone()))
}

/// One look at the pending pods `s<i>-pending`: a binding is recorded over an earlier
/// Unschedulable mark, a mark only for a pod not yet decided.
async fn poll_verdicts(cp: &ControlPlane, decided: &mut [Option<Result<String, String>>]) {
    complete_bindings(cp).await;
    let list = cp.raw("GET", "/api/v1/pods", None).await.expect("list pods");
    for p in list["items"].as_array().unwrap() {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let Some(i) = name
            .strip_suffix("-pending")
            .and_then(|s| s.strip_prefix('s'))
            .and_then(|s| s.parse::<usize>().ok())
        else {
            continue;
        };
        match kube_verdict(p) {
            Some(bound @ Ok(_)) => decided[i] = Some(bound),
            Some(refused) if decided[i].is_none() => decided[i] = Some(refused),
            _ => {}
        }
    }
}

/// kube-scheduler's verdict for `ns/name`, once it has one: bound node, or its Unschedulable
/// message.
fn kube_verdict(pod: &Value) -> Option<Result<String, String>> {
    if let Some(n) = pod["spec"]["nodeName"].as_str() {
        return Some(Ok(n.to_string()));
    }
    pod["status"]["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable")
            .then(|| Err(c["message"].as_str().unwrap_or_default().to_string()))
    })
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_agrees_with_kube_scheduler_on_randomized_snapshots() {
    let count = env_or("GPUSCALE_DIFF_SNAPSHOTS", 500) as usize;
    let seed = env_or("GPUSCALE_DIFF_SEED", 1);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let snaps: Vec<Snapshot> = (0..count).map(|i| generate(i, &mut rng)).collect();
    let verdicts: Vec<Result<String, String>> = snaps.iter().map(plan_verdict).collect();

    let cp = ControlPlane::start(Options::default()).await;
    let began = Instant::now();
    // Namespaces, nodes and bound pods first; pending pods last, so each is decided against the
    // whole snapshot.
    futures::stream::iter(snaps.iter().map(|s| cp.ensure_namespace(&s.ns)))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let post = |o: &Value| {
        let path = controlplane::object_path(o);
        let collection = path.rsplit_once('/').unwrap().0.to_string();
        let body = o.clone();
        let cp = &cp;
        async move {
            cp.raw("POST", &collection, Some(body)).await.unwrap_or_else(|e| panic!("create {path}: {e}"))
        }
    };
    // Storage first, with the statuses the volume controller would have given it.
    post(&local_class()).await;
    let storage: Vec<&Value> = snaps.iter().flat_map(|s| s.storage.iter()).collect();
    futures::stream::iter(storage.iter().map(|o| post(o))).buffer_unordered(16).collect::<Vec<_>>().await;
    let set_status = |o: &Value| {
        let path = format!("{}/status", controlplane::object_path(o));
        let patch = json!({"status": o["status"]});
        let cp = &cp;
        async move { cp.raw_patch(&path, &patch).await }
    };
    futures::stream::iter(storage.into_iter().map(set_status)).buffer_unordered(16).collect::<Vec<_>>().await;
    let bound: Vec<&Value> = snaps
        .iter()
        .flat_map(|s| s.nodes.iter().chain(s.pods.iter().filter(|p| p["spec"]["nodeName"].is_string())))
        .collect();
    futures::stream::iter(bound.into_iter().map(post)).buffer_unordered(16).collect::<Vec<_>>().await;
    // The TaintNodesByCondition admission plugin gave every new Node the not-ready taint; lift it
    // as the node lifecycle controller does for a Ready node.
    let lift = |n: &Value| {
        let path = format!("/api/v1/nodes/{}", n["metadata"]["name"].as_str().unwrap());
        let patch = json!({"spec": {"taints": n["spec"]["taints"]}});
        let cp = &cp;
        async move { cp.raw_patch(&path, &patch).await }
    };
    let nodes: Vec<&Value> = snaps.iter().flat_map(|s| s.nodes.iter()).collect();
    futures::stream::iter(nodes.into_iter().map(lift)).buffer_unordered(16).collect::<Vec<_>>().await;
    let pending: Vec<&Value> =
        snaps.iter().flat_map(|s| s.pods.iter().filter(|p| p["spec"]["nodeName"].is_null())).collect();
    futures::stream::iter(pending.into_iter().map(post)).buffer_unordered(16).collect::<Vec<_>>().await;
    let loaded = began.elapsed();

    // Wait until kube-scheduler has decided every pending pod. A binding is final, an
    // Unschedulable mark is not (its informers may not have shown it every object yet, and the
    // pod is retried when they do), so a binding replaces a mark; a pod marked Unschedulable
    // where the plan places it gets up to 15 s more to be bound.
    let mut decided: Vec<Option<Result<String, String>>> = vec![None; count];
    let deadline = Instant::now() + Duration::from_secs(300);
    while decided.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "kube-scheduler left {} pods undecided after 300 s",
            decided.iter().filter(|d| d.is_none()).count()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        poll_verdicts(&cp, &mut decided).await;
    }
    let retry_until = Instant::now() + Duration::from_secs(15);
    let provisional = |decided: &[Option<Result<String, String>>]| {
        decided.iter().zip(&verdicts).any(|(d, ours)| matches!(d, Some(Err(_))) && ours.is_ok())
    };
    while provisional(&decided) && Instant::now() < retry_until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        poll_verdicts(&cp, &mut decided).await;
    }
    let scheduled = began.elapsed();

    let mut disagree = Vec::new();
    let mut agree = 0;
    for (i, s) in snaps.iter().enumerate() {
        let kube = decided[i].clone().unwrap();
        let ours = &verdicts[i];
        if kube.is_ok() == ours.is_ok() {
            agree += 1;
            continue;
        }
        let show = |v: &Result<String, String>| match v {
            Ok(n) => format!("FITS {n}"),
            Err(r) => format!("UNSCHEDULABLE ({r})"),
        };
        let line = format!(
            "{}/{}: kube-scheduler {} | gpuscale {} | uses {:?}",
            s.ns,
            s.pending,
            show(&kube),
            show(ours),
            s.uses.0
        );
        disagree.push(line);
    }
    for l in &disagree {
        println!("DISAGREE {l}");
    }
    // How often each filter was exercised, and kube-scheduler's verdicts on those pods.
    let mut by_use: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for (s, d) in snaps.iter().zip(&decided) {
        for u in &s.uses.0 {
            let e = by_use.entry(u).or_default();
            if matches!(d, Some(Ok(_))) {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
    }
    for (u, (fits, refused)) in &by_use {
        println!("  {u}: {} pods, kube-scheduler bound {fits}, refused {refused}", fits + refused);
    }
    let bound = decided.iter().filter(|d| matches!(d, Some(Ok(_)))).count();
    println!(
        "scheduler differential (seed {seed}): {count} snapshots, kube-scheduler bound {bound}; {agree} agree, {} disagree; \
         loaded in {:.1} s, decided in {:.1} s",
        disagree.len(),
        loaded.as_secs_f64(),
        scheduled.as_secs_f64()
    );
    assert!(
        bound > count / 10 && bound < count,
        "the generator must give both verdicts: {bound} of {count} bound"
    );
    assert!(disagree.is_empty(), "plan disagrees with kube-scheduler:\n{}", disagree.join("\n"));
}
