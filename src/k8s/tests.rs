//! Conversion rules, one test per rule, on objects shaped like `kubectl get -o json` output.

use super::*;
use crate::model::mig::{MigPlacement, A100_40GB};
use crate::model::{GpuMode, NodeState, OwnerKind, SelectorOperator, TaintEffect, TolerationOperator};
use serde_json::{json, Value};

fn node(name: &str, labels: Value, allocatable: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "creationTimestamp": "2025-03-01T10:00:00Z"
        },
        "spec": {"providerID": format!("aws:///us-east-1a/i-{name}")},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            ]
        }
    })
}

fn pod(ns: &str, name: &str, containers: Value) -> Value {
    // The API server refuses a pod without containers; tests about other fields use one.
    let containers =
        if containers == json!([]) { json!([{"name": "main", "image": "busybox"}]) } else { containers };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2025-03-01T12:00:00Z"},
        "spec": {"containers": containers},
        "status": {"phase": "Pending"}
    })
}

fn gpu_container(resources: Value) -> Value {
    json!([{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "resources": {"requests": resources.clone(), "limits": resources}}])
}

/// Converts the objects the general way and, written as one `kubectl` List, the fast way
/// ([`json_list`]); every rule tested here must come out the same both ways (snapshot, warnings,
/// or error message).
fn load(values: Vec<Value>) -> Result<LoadedSnapshot, SnapshotError> {
    let text =
        serde_json::to_string_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": values})).unwrap();
    let objs: Vec<SourcedObject> = values
        .into_iter()
        .enumerate()
        .map(|(i, v)| SourcedObject::new(format!("test.json items[{i}]"), v))
        .collect();
    let general = convert(&objs);
    let fast = json_list::convert("test.json", &[&text]).expect("a List of objects takes the fast path");
    match (&general, &fast) {
        (Ok(g), Ok(f)) => {
            assert_eq!(
                serde_json::to_value(&g.snapshot).unwrap(),
                serde_json::to_value(&f.snapshot).unwrap()
            );
            assert_eq!(g.warnings, f.warnings);
        }
        (Err(g), Err(f)) => assert_eq!(g.to_string(), f.to_string()),
        (g, f) => panic!("general path: {:?}\nfast path: {:?}", g.as_ref().err(), f.as_ref().err()),
    }
    general
}

fn one_node(v: Value) -> (Node, Vec<String>) {
    let mut l = load(vec![v]).unwrap();
    (l.snapshot.nodes.remove(0), l.warnings)
}

fn one_pod(v: Value) -> crate::model::Workload {
    load(vec![v]).unwrap().snapshot.workloads.remove(0)
}

/// Cluster Autoscaler's local-storage rule: `hostPath` and disk-backed `emptyDir` volumes count,
/// unless `safe-to-evict-local-volumes` lists them; the controller's slimmed pods keep them.
#[test]
fn local_storage_and_safe_to_evict_are_read_from_the_pod() {
    let mut v = pod("ml", "cache", json!([]));
    v["spec"]["volumes"] = json!([
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        {"name": "host", "hostPath": {"path": "/var/cache"}},
        {"name": "cfg", "configMap": {"name": "c"}}
    ]);
    let w = one_pod(v.clone());
    assert_eq!(w.local_storage, ["scratch", "host"]);
    assert!(!w.safe_to_evict);
    let slim = slim_pod(serde_json::from_value(v.clone()).unwrap());
    let kept: Vec<String> = slim.spec.unwrap().volumes.unwrap().into_iter().map(|v| v.name).collect();
    assert_eq!(kept, ["scratch", "shm", "host"]);

    v["metadata"]["annotations"] =
        json!({"cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": "host, scratch"});
    assert!(one_pod(v.clone()).local_storage.is_empty());
    v["metadata"]["annotations"] =
        json!({"cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": "host"});
    assert_eq!(one_pod(v.clone()).local_storage, ["scratch"]);
    v["metadata"]["annotations"] = json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"});
    let w = one_pod(v);
    assert!(w.safe_to_evict && w.eviction_blocked.is_none());
}

/// A pod in phase Unknown (its node's kubelet stopped reporting) may still run there: it stays
/// bound, so drains wait for it and scale-down moves it; unbound, it is skipped as before.
#[test]
fn a_bound_pod_in_phase_unknown_is_kept() {
    let mut v = pod("ml", "lost", json!([{"name": "m", "resources": {"requests": {"cpu": "1"}}}]));
    v["status"]["phase"] = json!("Unknown");
    let l = load(vec![v.clone()]).unwrap();
    assert!(l.snapshot.workloads.is_empty() && l.warnings.iter().any(|w| w.contains("phase Unknown")));
    v["spec"]["nodeName"] = json!("node-1");
    let w = one_pod(v);
    assert_eq!(
        (w.id.as_str(), w.node_name.as_deref(), w.requests.cpu_milli),
        ("ml/lost", Some("node-1"), 1000)
    );
}

fn pod_err(v: Value) -> String {
    load(vec![v]).unwrap_err().to_string()
}

#[test]
fn node_capacity_labels_and_identity() {
    let mut v = node(
        "ip-10-0-1-5.ec2.internal",
        json!({
            "failure-domain.beta.kubernetes.io/zone": "us-east-1b",
            "beta.kubernetes.io/instance-type": "m6i.4xlarge",
            "eks.amazonaws.com/nodegroup": "cpu-general",
            "kubernetes.io/hostname": "ip-10-0-1-5.ec2.internal"
        }),
        json!({"cpu": "15890m", "memory": "63218408Ki", "pods": "234"}),
    );
    v["spec"]["unschedulable"] = json!(true);
    v["spec"]["taints"] = json!([{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]);
    v["metadata"]["annotations"] = json!({"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"});
    let (n, warnings) = one_node(v);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(n.allocatable.cpu_milli, 15_890);
    assert_eq!(n.allocatable.memory_bytes, 63_218_408 * 1024);
    assert_eq!(n.zone.as_deref(), Some("us-east-1b"));
    assert_eq!(n.instance_type.as_deref(), Some("m6i.4xlarge"));
    assert_eq!(n.node_group.as_deref(), Some("cpu-general"));
    assert_eq!(n.provider_id.as_deref(), Some("aws:///us-east-1a/i-ip-10-0-1-5.ec2.internal"));
    assert!(n.unschedulable);
    assert!(n.scale_down_disabled);
    assert_eq!(n.taints[0].effect, TaintEffect::NoSchedule);
    assert_eq!(n.taints[0].value, "infra");
    assert_eq!(n.state, NodeState::Ready);
    assert!(n.gpus.is_empty());
    assert_eq!(n.gpu_model, None);
}

/// A gpuscale drain that has not evicted anything may still be given up, so the node is planned
/// as it was before: without the drain's taint, cordoned only if it was before the drain. Once an
/// eviction was attempted the drain always finishes, and the node is shown as it is.
#[test]
fn a_drain_that_has_not_evicted_shows_the_node_as_before_it() {
    let drained = |annotations: Value| {
        let mut v = node("gpu-1", json!({}), json!({"cpu": "8", "memory": "32Gi"}));
        v["metadata"]["annotations"] = annotations;
        v["spec"]["unschedulable"] = json!(true);
        v["spec"]["taints"] = json!([
            {"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
        ]);
        one_node(v).0
    };
    let taint_keys = |n: &Node| n.taints.iter().map(|t| t.key.clone()).collect::<Vec<_>>();
    let fresh = drained(json!({DRAIN_STARTED_AT: "2026-01-01T00:00:00Z"}));
    assert_eq!((fresh.unschedulable, taint_keys(&fresh)), (false, vec!["dedicated".to_string()]));
    let was_cordoned = drained(json!({DRAIN_STARTED_AT: "2026-01-01T00:00:00Z", DRAIN_WAS_CORDONED: "true"}));
    assert_eq!((was_cordoned.unschedulable, taint_keys(&was_cordoned).len()), (true, 1));
    let evicting = drained(json!({DRAIN_STARTED_AT: "2026-01-01T00:00:00Z", DRAIN_EVICTED: "true"}));
    assert_eq!((evicting.unschedulable, taint_keys(&evicting).len()), (true, 2));
    // The taint alone (annotations lost) is a drain too.
    let taint_only = drained(json!({}));
    assert_eq!((taint_only.unschedulable, taint_keys(&taint_only)), (false, vec!["dedicated".to_string()]));
    // Someone else's cordon is left alone.
    let mut v = node("gpu-2", json!({}), json!({"cpu": "8", "memory": "32Gi"}));
    v["spec"]["unschedulable"] = json!(true);
    assert!(one_node(v).0.unschedulable);
}

#[test]
fn node_group_labels_in_order_with_explicit_override() {
    let labels = |extra: Value| {
        let mut l = json!({"cloud.google.com/gke-nodepool": "pool-a", "karpenter.sh/nodepool": "kp"});
        l.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        l
    };
    let alloc = json!({"cpu": "4", "memory": "16Gi"});
    let (n, _) = one_node(node("a", labels(json!({})), alloc.clone()));
    assert_eq!(n.node_group.as_deref(), Some("pool-a"));
    let (n, _) = one_node(node("a", labels(json!({"gpuscale.io/node-group": "override"})), alloc.clone()));
    assert_eq!(n.node_group.as_deref(), Some("override"));
    let (n, _) = one_node(node(
        "a",
        json!({"alpha.eksctl.io/nodegroup-name": "ng-1", "karpenter.sh/nodepool": "kp"}),
        alloc,
    ));
    assert_eq!(n.node_group.as_deref(), Some("ng-1"));
}

#[test]
fn whole_gpus_from_gfd_labels() {
    let (n, warnings) = one_node(node(
        "h100-a",
        json!({
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.clique": "cluster-a.0"
        }),
        json!({"cpu": "191450m", "memory": "2043617520Ki", "nvidia.com/gpu": "8"}),
    ));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(n.gpu_model.as_deref(), Some("H100-80GB"));
    assert_eq!(n.gpus.len(), 8);
    assert!(n.gpus.iter().all(|g| g.mode == GpuMode::Standard && g.memory_mib == 81_559));
    assert_eq!(n.gpus[7].index, 7);
    assert_eq!(n.topology.nvlink_domain, vec![0; 8]);
    assert_eq!(n.topology.numa, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(n.topology.clique.as_deref(), Some("cluster-a.0"));
}

#[test]
fn unknown_gpu_product_keeps_raw_name_with_warning() {
    let (n, warnings) = one_node(node(
        "x",
        json!({"nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000", "nvidia.com/gpu.count": "2"}),
        json!({"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "2"}),
    ));
    assert_eq!(n.gpu_model.as_deref(), Some("NVIDIA-RTX-PRO-6000"));
    assert_eq!(n.gpus.len(), 2);
    assert_eq!(n.gpus[0].memory_mib, 0);
    assert!(warnings[0].contains("NVIDIA-RTX-PRO-6000"), "{warnings:?}");
}

#[test]
fn time_sliced_gpus_plain_and_renamed() {
    let (n, _) = one_node(node(
        "t4",
        json!({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1",
               "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.memory": "15360"}),
        json!({"cpu": "3920m", "memory": "15Gi", "nvidia.com/gpu": "4"}),
    ));
    assert_eq!(n.gpu_model.as_deref(), Some("T4"));
    assert_eq!(n.gpus.len(), 1);
    assert_eq!(n.gpus[0].mode, GpuMode::TimeSliced { replicas: 4 });
    assert_eq!(n.gpus[0].memory_mib, 15_360);

    let (n, warnings) = one_node(node(
        "l4",
        json!({"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "4",
               "nvidia.com/gpu.replicas": "2"}),
        json!({"cpu": "47", "memory": "180Gi", "nvidia.com/gpu.shared": "8"}),
    ));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(n.gpu_model.as_deref(), Some("L4"));
    assert_eq!(n.gpus.len(), 4);
    assert!(n.gpus.iter().all(|g| g.mode == GpuMode::TimeSliced { replicas: 2 }));
}

fn mig_layouts(n: &Node) -> Vec<Vec<MigPlacement>> {
    n.gpus
        .iter()
        .filter_map(|g| match &g.mode {
            GpuMode::Mig { instances, dynamic } => {
                assert!(!dynamic);
                Some(instances.iter().map(|i| i.placement.clone()).collect())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn mig_mixed_strategy_distributes_valid_layouts() {
    // mig-parted "all-balanced" on an 8x A100-40GB: per GPU 2x 1g.5gb, 1x 2g.10gb, 1x 3g.20gb.
    let (n, _) = one_node(node(
        "a100",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8",
               "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.memory": "40960"}),
        json!({"cpu": "95", "memory": "1100Gi", "nvidia.com/mig-1g.5gb": "16",
               "nvidia.com/mig-2g.10gb": "8", "nvidia.com/mig-3g.20gb": "8"}),
    ));
    let layouts = mig_layouts(&n);
    assert_eq!(layouts.len(), 8);
    for l in &layouts {
        A100_40GB.validate(l).unwrap();
        let count = |p: &str| l.iter().filter(|i| i.profile == p).count();
        assert_eq!((count("1g.5gb"), count("2g.10gb"), count("3g.20gb")), (2, 1, 1));
    }
    assert!(n.gpus.iter().all(|g| g.memory_mib == 40_960));
}

#[test]
fn mig_mixed_with_some_gpus_whole() {
    let (n, _) = one_node(node(
        "a100",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8",
               "nvidia.com/mig.strategy": "mixed"}),
        json!({"cpu": "95", "memory": "1100Gi", "nvidia.com/gpu": "4",
               "nvidia.com/mig-1g.5gb": "28"}),
    ));
    assert_eq!(n.gpus.len(), 8);
    assert_eq!(n.gpus.iter().filter(|g| g.mode == GpuMode::Standard).count(), 4);
    let layouts = mig_layouts(&n);
    assert_eq!(layouts.len(), 4);
    assert!(layouts.iter().all(|l| l.len() == 7));
    let indexes: Vec<u8> = n.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indexes, (0..8).collect::<Vec<u8>>());
}

#[test]
fn mig_unknown_profile_names_node_and_resource() {
    let err = load(vec![node(
        "a100-bad",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1"}),
        json!({"cpu": "8", "memory": "64Gi", "nvidia.com/mig-3g.40gb": "2"}),
    )])
    .unwrap_err()
    .to_string();
    assert!(err.contains("Node a100-bad"), "{err}");
    assert!(err.contains("nvidia.com/mig-3g.40gb"), "{err}");
    assert!(err.contains("A100-40GB"), "{err}");
}

#[test]
fn mig_instances_that_cannot_fit_are_an_error() {
    let err = load(vec![node(
        "a100-over",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1"}),
        json!({"cpu": "8", "memory": "64Gi", "nvidia.com/mig-3g.20gb": "3"}),
    )])
    .unwrap_err()
    .to_string();
    assert!(err.contains("do not fit on 1 GPUs"), "{err}");
}

#[test]
fn mig_single_strategy() {
    let (n, _) = one_node(node(
        "a100-single",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
               "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "14",
               "nvidia.com/gpu.memory": "4864"}),
        json!({"cpu": "30", "memory": "200Gi", "nvidia.com/gpu": "14"}),
    ));
    assert_eq!(n.gpu_model.as_deref(), Some("A100-40GB"));
    let layouts = mig_layouts(&n);
    assert_eq!(layouts.len(), 2, "14 instances of 1g.5gb fill two GPUs");
    assert!(layouts.iter().all(|l| l.len() == 7));
    assert_eq!(n.gpus[0].memory_mib, 40 * 1024, "physical memory from the catalog");
    assert_eq!(n.labels.get("nvidia.com/mig.strategy").map(String::as_str), Some("single"));
}

#[test]
fn layout_mig_uses_fewest_gpus_when_count_unknown() {
    let p = |n: &str| A100_40GB.profile(n).unwrap();
    let l = layout_mig(&A100_40GB, &[(p("7g.40gb"), 1), (p("1g.5gb"), 7)], None).unwrap();
    assert_eq!(l.len(), 2);
    let l = layout_mig(&A100_40GB, &[(p("4g.20gb"), 1), (p("3g.20gb"), 1)], None).unwrap();
    assert_eq!(l.len(), 1);
    A100_40GB.validate(&l[0]).unwrap();
    assert!(layout_mig(&A100_40GB, &[(p("4g.20gb"), 2)], Some(1)).is_none());
}

#[test]
fn hami_register_annotation() {
    let mut v = node(
        "hami-1",
        json!({"nvidia.com/gpu.present": "true", "gpu": "on"}),
        json!({"cpu": "63", "memory": "250Gi", "nvidia.com/gpu": "20"}),
    );
    v["metadata"]["annotations"] = json!({
        "hami.io/node-handshake": "Requesting_2025.03.01 10:00:00",
        "hami.io/node-nvidia-register": "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,1,true:"
    });
    let (n, warnings) = one_node(v);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(n.gpu_model.as_deref(), Some("V100-32GB"));
    assert_eq!(n.gpus.len(), 2, "physical GPUs, not the 20 split slots");
    assert!(n.gpus.iter().all(|g| g.mode == GpuMode::Standard && g.memory_mib == 32_768));
    assert_eq!(n.topology.numa, vec![0, 1]);

    let json_form = parse_hami_register(
        r#"[{"id":"GPU-a","count":4,"devmem":24576,"devcore":100,"type":"NVIDIA-NVIDIA A10","numa":0,"health":true}]"#,
    )
    .unwrap();
    assert_eq!(json_form[0].memory_mib, 24_576);
    assert!(parse_hami_register("GPU-a,10,abc,100,T,0,true:").is_err());
}

#[test]
fn node_lifecycle_states() {
    let gpu_labels = json!({"node.kubernetes.io/instance-type": "p4d.24xlarge",
                            "nvidia.com/gpu.present": "true",
                            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                            "nvidia.com/gpu.count": "8",
                            "nvidia.com/mig.config": "all-1g.5gb"});
    // Cluster Autoscaler's MIG bug: Ready, but no GPU resources yet. In-flight, not empty.
    let (n, _) = one_node(node(
        "init",
        gpu_labels.clone(),
        json!({"cpu": "95", "memory": "1100Gi", "nvidia.com/gpu": "0"}),
    ));
    assert_eq!(n.state, NodeState::Initializing);
    assert_eq!(n.gpus.len(), 8);
    assert_eq!(n.gpu_model.as_deref(), Some("A100-40GB"));

    // Instance type alone implies GPUs.
    let (n, _) = one_node(node(
        "init2",
        json!({"node.kubernetes.io/instance-type": "g6.12xlarge"}),
        json!({"cpu": "47", "memory": "180Gi"}),
    ));
    assert_eq!(n.state, NodeState::Initializing);
    assert_eq!(n.gpus.len(), 4);
    assert_eq!(n.gpu_model.as_deref(), Some("L4"));

    let mut v = node("notready", json!({}), json!({"cpu": "4", "memory": "16Gi"}));
    v["status"]["conditions"][1]["status"] = json!("Unknown");
    assert_eq!(one_node(v).0.state, NodeState::Initializing);

    for taint in [
        json!({"key": "ToBeDeletedByClusterAutoscaler", "value": "1740823200", "effect": "NoSchedule"}),
        json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}),
    ] {
        let mut v = node("del", json!({}), json!({"cpu": "4", "memory": "16Gi"}));
        v["spec"]["taints"] = json!([taint]);
        assert_eq!(one_node(v).0.state, NodeState::Deleting);
    }
    let mut v = node("dnd", json!({}), json!({"cpu": "4", "memory": "16Gi"}));
    v["metadata"]["annotations"] = json!({"karpenter.sh/do-not-disrupt": "true"});
    assert!(one_node(v).0.scale_down_disabled);
}

#[test]
fn bad_node_quantity_names_object_field_and_value() {
    let err = load(vec![node("n1", json!({}), json!({"cpu": "4 cores", "memory": "16Gi"}))]).unwrap_err();
    match &err {
        SnapshotError::Quantity { origin, object, field, value, .. } => {
            assert_eq!(origin, "test.json items[0]");
            assert_eq!(object, "Node n1");
            assert_eq!(field, "status.allocatable.cpu");
            assert_eq!(value, "4 cores");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn effective_requests_follow_the_kubernetes_formula() {
    let mut v = pod(
        "ml",
        "p",
        json!([
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}}
        ]),
    );
    v["spec"]["initContainers"] = json!([
        {"name": "big-init", "resources": {"requests": {"cpu": "2", "memory": "256Mi"}}},
        {"name": "sidecar", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
        {"name": "late-init", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
    ]);
    v["spec"]["overhead"] = json!({"cpu": "250m", "memory": "120Mi"});
    let w = one_pod(v);
    // cpu: max(0.5 + 1 + 0.1 sidecar, 2, 1 + 0.1) + 0.25 = 2.25
    assert_eq!(w.requests.cpu_milli, 2250);
    // memory: max(1Gi + 512Mi + 64Mi, 256Mi, 2Gi + 64Mi) + 120Mi = 2Gi + 184Mi
    assert_eq!(w.requests.memory_bytes, (2048 + 64 + 120) << 20);

    let mut v = pod("ml", "q", json!([{"name": "a", "resources": {"requests": {"cpu": "1"}}}]));
    v["spec"]["resources"] = json!({"requests": {"cpu": "3", "memory": "1Gi"}});
    let w = one_pod(v);
    assert_eq!(w.requests.cpu_milli, 3000, "pod-level resources win");
}

#[test]
fn gpu_demands_in_every_spelling() {
    let demand = |r: Value| one_pod(pod("ml", "p", gpu_container(r))).gpu;
    assert_eq!(demand(json!({"nvidia.com/gpu": "2"})), GpuDemand::Whole { count: 2 });
    assert_eq!(
        demand(json!({"nvidia.com/mig-3g.20gb": 1})),
        GpuDemand::Mig { profile: "3g.20gb".into(), count: 1 }
    );
    assert_eq!(demand(json!({"nvidia.com/gpu.shared": "1"})), GpuDemand::Shared { count: 1 });
    assert_eq!(
        demand(json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})),
        GpuDemand::Fraction { count: 1, milli: 300, memory_mib: 3000 }
    );
    assert_eq!(demand(json!({"cpu": "1"})), GpuDemand::None);
    // Limits only (extended resources are usually written as limits).
    let w = one_pod(pod("ml", "p", json!([{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "4"}}}])));
    assert_eq!(w.gpu, GpuDemand::Whole { count: 4 });
}

#[test]
fn kai_fraction_annotations() {
    let with = |ann: Value| {
        let mut v = pod("team-a", "p", json!([{"name": "m"}]));
        v["metadata"]["annotations"] = ann;
        v
    };
    assert_eq!(
        one_pod(with(json!({"gpu-fraction": "0.5"}))).gpu,
        GpuDemand::Fraction { count: 1, milli: 500, memory_mib: 0 }
    );
    assert_eq!(
        one_pod(with(json!({"gpu-memory": "4000"}))).gpu,
        GpuDemand::Fraction { count: 1, milli: 0, memory_mib: 4000 }
    );
    assert_eq!(
        one_pod(with(json!({"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}))).gpu,
        GpuDemand::Fraction { count: 2, milli: 250, memory_mib: 0 }
    );
    let err = pod_err(with(json!({"gpu-fraction": "0.5", "gpu-memory": "4000"})));
    assert!(err.contains("Pod team-a/p") && err.contains("gpu-memory"), "{err}");
    let err = pod_err(with(json!({"gpu-fraction": "1.5"})));
    assert!(err.contains("metadata.annotations[gpu-fraction]"), "{err}");
}

#[test]
fn contradictory_or_unknown_gpu_requests_are_errors() {
    let err =
        pod_err(pod("ml", "mixed", gpu_container(json!({"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 1}))));
    assert!(err.contains("Pod ml/mixed"), "{err}");
    assert!(err.contains("mixed GPU requests"), "{err}");
    assert!(err.contains("spec.containers[0].resources.requests.nvidia.com/"), "{err}");

    let err = pod_err(pod(
        "ml",
        "two-profiles",
        gpu_container(json!({"nvidia.com/mig-1g.5gb": 1, "nvidia.com/mig-2g.10gb": 1})),
    ));
    assert!(err.contains("mixed GPU requests"), "{err}");

    let err = pod_err(pod("ml", "unknown", gpu_container(json!({"nvidia.com/gpu.sharedd": 1}))));
    assert!(err.contains("unknown GPU resource nvidia.com/gpu.sharedd"), "{err}");

    let err = pod_err(pod("ml", "hami-no-count", gpu_container(json!({"nvidia.com/gpumem": 1000}))));
    assert!(err.contains("need nvidia.com/gpu"), "{err}");

    let mut v = pod("ml", "kai-and-gpu", gpu_container(json!({"nvidia.com/gpu": 1})));
    v["metadata"]["annotations"] = json!({"gpu-fraction": "0.5"});
    assert!(pod_err(v).contains("mixed GPU requests"));

    let err = pod_err(pod("ml", "frac", gpu_container(json!({"nvidia.com/gpu": "0.5"}))));
    assert!(err.contains("must be a whole number") && err.contains("\"0.5\""), "{err}");
}

#[test]
fn pod_scheduling_fields() {
    let mut v = pod("prod", "web-7d9f-abc", json!([{"name": "m", "resources": {"requests": {"cpu": "1"}}}]));
    v["metadata"]["labels"] = json!({"app": "web", "kueue.x-k8s.io/queue-name": "team-web"});
    v["metadata"]["ownerReferences"] = json!([
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f", "uid": "u1", "controller": true}
    ]);
    v["metadata"]["annotations"] = json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"});
    v["spec"]["priority"] = json!(1000);
    v["spec"]["nodeSelector"] = json!({"eks.amazonaws.com/nodegroup": "gpu-h100"});
    v["spec"]["tolerations"] = json!([
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "team", "value": "web"}
    ]);
    v["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a", "us-east-1b"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
    ]}}});
    v["spec"]["nodeName"] = json!("node-1");
    v["status"]["phase"] = json!("Running");
    let l = load(vec![v]).unwrap();
    let w = &l.snapshot.workloads[0];
    assert_eq!(w.id, "prod/web-7d9f-abc");
    assert_eq!(w.priority, 1000);
    assert_eq!(w.tenant.as_deref(), Some("team-web"));
    assert_eq!(w.owner, OwnerKind::ReplicaSet);
    assert_eq!(w.eviction_blocked.as_deref(), Some("cluster-autoscaler.kubernetes.io/safe-to-evict=false"));
    assert_eq!(w.node_selector["eks.amazonaws.com/nodegroup"], "gpu-h100");
    assert_eq!(w.tolerations.len(), 3);
    assert_eq!(w.tolerations[0].operator, TolerationOperator::Exists);
    assert_eq!(w.tolerations[2].operator, TolerationOperator::Equal);
    assert_eq!(w.tolerations[2].effect, None);
    assert_eq!(w.affinity_terms.len(), 2);
    assert_eq!(w.affinity_terms[0][0].operator, SelectorOperator::In);
    assert_eq!(w.affinity_terms[1][0].key, "kubernetes.io/hostname");
    assert_eq!(w.node_name.as_deref(), Some("node-1"));
    assert_eq!(w.created_at, Some(1_740_830_400));
    assert!(l.warnings.iter().any(|x| x.contains("node-1")), "bound to a missing node");

    let mut v = pod("ml", "bare", json!([]));
    v["metadata"]["annotations"] = json!({"karpenter.sh/do-not-disrupt": "true"});
    let w = one_pod(v);
    assert_eq!(w.owner, OwnerKind::None);
    assert_eq!(w.tenant.as_deref(), Some("ml"), "namespace is the default tenant");
    assert_eq!(w.eviction_blocked.as_deref(), Some("karpenter.sh/do-not-disrupt=true"));

    let mut v = pod("ml", "labelled", json!([]));
    v["metadata"]["labels"] = json!({"gpuscale.io/tenant": "research", "kueue.x-k8s.io/queue-name": "q"});
    assert_eq!(one_pod(v).tenant.as_deref(), Some("research"));
}

#[test]
fn gangs_from_every_convention() {
    let with = |labels: Value, annotations: Value| {
        let mut v = pod("ml", "w-0", json!([]));
        v["metadata"]["labels"] = labels;
        v["metadata"]["annotations"] = annotations;
        v
    };
    let pg = json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "llama", "namespace": "ml"}, "spec": {"minMember": 4, "scheduleTimeoutSeconds": 60}});
    let mut v = with(
        json!({"scheduling.x-k8s.io/pod-group": "llama"}),
        json!({"gpuscale.io/gang-topology": "topology.kubernetes.io/zone"}),
    );
    let l = load(vec![pg, v.clone()]).unwrap();
    let w = &l.snapshot.workloads[0];
    assert_eq!(w.gang.as_deref(), Some("ml/llama"));
    assert_eq!(w.gang_min_members, Some(4));
    assert_eq!(w.gang_topology_key.as_deref(), Some("topology.kubernetes.io/zone"));
    // Without the PodGroup object: all members.
    v["metadata"]["annotations"] = json!({});
    assert_eq!(one_pod(v).gang_min_members, None);

    let w = one_pod(with(json!({}), json!({"scheduling.k8s.io/group-name": "vc-job"})));
    assert_eq!(w.gang.as_deref(), Some("ml/vc-job"));
    let w = one_pod(with(
        json!({"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "2"}),
        json!({"leaderworkerset.sigs.k8s.io/size": "4"}),
    ));
    assert_eq!(w.gang.as_deref(), Some("ml/vllm-2"));
    assert_eq!(w.gang_min_members, Some(4));
    let w = one_pod(with(json!({"jobset.sigs.k8s.io/jobset-name": "js"}), json!({})));
    assert_eq!(w.gang.as_deref(), Some("ml/js"));
    let w = one_pod(with(json!({"training.kubeflow.org/job-name": "pt"}), json!({})));
    assert_eq!(w.gang.as_deref(), Some("ml/pt"));
    assert_eq!(one_pod(with(json!({}), json!({}))).gang, None);
}

#[test]
fn only_pending_and_running_pods_are_kept() {
    let with_phase = |name: &str, phase: &str| {
        let mut v = pod("ns", name, json!([]));
        v["status"]["phase"] = json!(phase);
        if phase != "Pending" {
            v["spec"]["nodeName"] = json!("n1");
        }
        v
    };
    let l = load(vec![
        with_phase("a", "Pending"),
        with_phase("b", "Running"),
        with_phase("c", "Succeeded"),
        with_phase("d", "Failed"),
    ])
    .unwrap();
    let ids: Vec<&str> = l.snapshot.workloads.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(ids, ["ns/a", "ns/b"]);
    assert_eq!(l.snapshot.pending().count(), 1, "b is bound to n1");
    // A Running pod bound to no node does not exist; it is an error, not a pending pod.
    let mut unbound = with_phase("e", "Running");
    unbound["spec"].as_object_mut().unwrap().remove("nodeName");
    assert!(pod_err(unbound).contains("spec.nodeName"));
}

#[test]
fn pods_a_real_api_server_refuses_are_errors() {
    let mut no_spec = pod("ns", "a", json!([]));
    no_spec.as_object_mut().unwrap().remove("spec");
    assert!(pod_err(no_spec).contains("Pod ns/a: spec:"));
    let mut null_containers = pod("ns", "a", json!([]));
    null_containers["spec"]["containers"] = Value::Null;
    assert!(pod_err(null_containers).contains("spec.containers"));
    let unequal = pod(
        "ns",
        "a",
        json!([{"name": "m", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}}]),
    );
    let e = pod_err(unequal);
    assert!(e.contains("spec.containers[0].resources.requests.nvidia.com/gpu") && e.contains("equal"), "{e}");
    let no_limit =
        pod("ns", "a", json!([{"name": "m", "resources": {"requests": {"vpc.amazonaws.com/efa": "1"}}}]));
    assert!(pod_err(no_limit).contains("limit must be set"));
    // Equal, or a limit alone (the request defaults to it), is what the API server accepts.
    let limit_only = pod("ns", "a", json!([{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]));
    assert_eq!(one_pod(limit_only).gpu, crate::model::GpuDemand::Whole { count: 2 });
}

#[test]
fn bound_pods_are_accounted_on_their_nodes() {
    let mig = node(
        "a100",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1"}),
        json!({"cpu": "10", "memory": "100Gi", "nvidia.com/mig-3g.20gb": "2"}),
    );
    let ts = node(
        "t4",
        json!({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "4"}),
        json!({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "4"}),
    );
    let whole = node(
        "h100",
        json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}),
        json!({"cpu": "190", "memory": "1900Gi", "nvidia.com/gpu": "8"}),
    );
    let bound = |name: &str, node: &str, r: Value| {
        let mut v = pod("ml", name, gpu_container(r));
        v["spec"]["nodeName"] = json!(node);
        v["status"]["phase"] = json!("Running");
        v
    };
    let l = load(vec![
        mig,
        ts,
        whole,
        bound("m", "a100", json!({"cpu": "2", "nvidia.com/mig-3g.20gb": 1})),
        bound("t", "t4", json!({"cpu": "1", "nvidia.com/gpu": 3})),
        bound("h", "h100", json!({"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4})),
        bound("over", "a100", json!({"nvidia.com/mig-3g.20gb": 2})),
    ])
    .unwrap();
    let n = &with_running(&l);
    assert_eq!(n[0].allocated.cpu_milli, 2000);
    let GpuMode::Mig { instances, .. } = &n[0].gpus[0].mode else { panic!("MIG node") };
    assert_eq!(instances.iter().filter(|i| i.used).count(), 1);
    assert_eq!(n[1].gpus[0].used_replicas, 3);
    assert_eq!(n[2].idle_gpus(), 4);
    assert_eq!(n[2].allocated.memory_bytes, 64 << 30);
    assert!(l.warnings.iter().any(|w| w.contains("ml/over")), "{:?}", l.warnings);
}

#[test]
fn hami_pods_use_the_allocated_device_and_memory_percentage() {
    let mut hami = node(
        "hami",
        json!({"nvidia.com/gpu.present": "true"}),
        json!({"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "20"}),
    );
    hami["metadata"]["annotations"] = json!({"hami.io/node-nvidia-register":
        "GPU-aaa,10,24576,100,NVIDIA-NVIDIA A10,0,true:GPU-bbb,10,24576,100,NVIDIA-NVIDIA A10,0,true:"});
    let mut p =
        pod("ml", "vgpu", gpu_container(json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50})));
    p["metadata"]["annotations"] = json!({"hami.io/vgpu-devices-allocated": "GPU-bbb,NVIDIA,12288,0:;"});
    p["spec"]["nodeName"] = json!("hami");
    p["status"]["phase"] = json!("Running");
    let l = load(vec![hami, p]).unwrap();
    assert_eq!(l.snapshot.workloads[0].gpu, GpuDemand::Fraction { count: 1, milli: 0, memory_mib: 12_288 });
    let n = &with_running(&l)[0];
    assert_eq!(n.gpu_model.as_deref(), Some("A10"));
    assert_eq!(n.gpus[0].used_memory_mib, 0);
    assert_eq!(n.gpus[1].used_memory_mib, 12_288, "the GPU HAMi recorded");
}

#[test]
fn pdbs_and_skipped_kinds() {
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["canary"]}]}},
        "status": {"currentHealthy": 3, "desiredHealthy": 2, "disruptionsAllowed": 1, "expectedPods": 3}});
    let svc =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "prod"}});
    let l = load(vec![pdb, svc]).unwrap();
    let b = &l.snapshot.disruption_budgets[0];
    assert_eq!(b.id, "prod/web");
    assert_eq!(b.disruptions_allowed, 1);
    assert_eq!(b.selector.match_labels["app"], "web");
    assert_eq!(b.selector.match_expressions[0].operator, SelectorOperator::NotIn);
    assert!(l.warnings.iter().any(|w| w.contains("1 Service (v1)")));
}

#[test]
fn wrong_shape_names_the_field() {
    let mut v = node("n", json!({}), json!({"cpu": "1", "memory": "1Gi"}));
    v["spec"]["taints"] = json!([{"key": "k", "effect": 5}]);
    let err = load(vec![v]).unwrap_err();
    assert!(matches!(&err, SnapshotError::Decode { field, .. } if field.contains("taints")), "{err}");
}

#[test]
fn mig_single_nodes_account_gpu_requests_as_instances() {
    let n = node(
        "a100-single",
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
               "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "4"}),
        json!({"cpu": "30", "memory": "200Gi", "nvidia.com/gpu": "4"}),
    );
    let mut p = pod("ml", "p", gpu_container(json!({"nvidia.com/gpu": 3})));
    p["spec"]["nodeName"] = json!("a100-single");
    let l = load(vec![n, p]).unwrap();
    assert!(l.snapshot.nodes[0].gpus.iter().all(|g| g.is_idle()), "nodes come with capacity only");
    let node = &with_running(&l)[0];
    assert_eq!(node.gpus.len(), 2, "two 3g.20gb per A100-40GB");
    let used: usize = mig_layouts(node).iter().map(Vec::len).sum();
    assert_eq!(used, 4);
    let in_use: usize = node
        .gpus
        .iter()
        .map(|g| match &g.mode {
            GpuMode::Mig { instances, .. } => instances.iter().filter(|i| i.used).count(),
            _ => 0,
        })
        .sum();
    assert_eq!(in_use, 3);
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
}

#[test]
fn hami_use_gputype_lists_accepted_models() {
    let mut v = pod("ml", "p", gpu_container(json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000})));
    v["metadata"]["annotations"] = json!({"nvidia.com/use-gputype": "A100,T4"});
    let w = one_pod(v);
    assert_eq!(w.gpu_models, ["A100-80GB", "A100-40GB", "T4"]);
}

/// The nodes with the running pods' recorded devices applied, as the planner does.
fn with_running(l: &LoadedSnapshot) -> Vec<crate::model::Node> {
    let mut nodes = l.snapshot.nodes.clone();
    for w in &l.snapshot.workloads {
        let (Some(name), Some(devices)) = (&w.node_name, &w.devices) else { continue };
        if let Some(n) = nodes.iter_mut().find(|n| &n.name == name) {
            n.allocate(&w.requests, devices);
        }
    }
    nodes
}

/// Objects a real API server would have refused (issue #27: the embedded example once had a
/// label value with spaces) load with a warning naming the object, field and value.
#[test]
fn objects_a_real_server_refuses_are_warned_about() {
    let mut n = node(
        "gpu-1",
        json!({"node.kubernetes.io/instance-type": "g6.12xlarge", "provider": "Amazon EC2 g6.12xlarge"}),
        json!({"cpu": "47", "memory": "180Gi"}),
    );
    n["spec"]["taints"] = json!([{"key": "bad key", "value": "ok", "effect": "NoSchedule"}]);
    n["metadata"]["annotations"] = json!({"Example.COM/Mixed-Case": "fine", "two/slashes/here": "bad"});
    let mut p = pod("ML", "Train_0", gpu_container(json!({"nvidia.com/gpu": "1"})));
    p["metadata"]["labels"] = json!({"app": "train"});
    let loaded = load(vec![n, p]).expect("a refusable object still loads");
    let w = loaded.warnings.join("\n");
    for expected in [
        "test.json items[0]: Node gpu-1: metadata.labels[provider] \"Amazon EC2 g6.12xlarge\": a real API server refuses",
        "test.json items[0]: Node gpu-1: spec.taints[0].key \"bad key\": a real API server refuses",
        "test.json items[0]: Node gpu-1: metadata.annotations key \"two/slashes/here\"",
        "test.json items[1]: Pod ML/Train_0: metadata.name \"Train_0\"",
        "test.json items[1]: Pod ML/Train_0: metadata.namespace \"ML\"",
    ] {
        assert!(w.contains(expected), "missing {expected:?} in:\n{w}");
    }
    assert_eq!(w.matches("a real API server refuses").count(), 5, "{w}");
}

/// Preferred node affinity and `ScheduleAnyway` spread are read as preferences (they score in
/// kube-scheduler, never filter); a weight outside 1-100 is refused as the API server does.
#[test]
fn preferences_are_read_apart_from_requirements() {
    let mut p = pod("ml", "p", gpu_container(json!({"nvidia.com/gpu": "1"})));
    p["metadata"]["labels"] = json!({"app": "web"});
    p["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 30, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}},
        {"weight": 5, "preference": {}}]}});
    p["spec"]["topologySpreadConstraints"] = json!([
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]);
    let w = one_pod(p.clone());
    assert!(w.affinity_terms.is_empty(), "preferred terms never filter");
    assert_eq!(w.preferences.node_affinity.len(), 1, "an empty preferred term scores nothing");
    assert_eq!(w.preferences.node_affinity[0].0, 30);
    assert_eq!(w.preferences.spread.len(), 1);
    assert_eq!(w.preferences.spread[0].topology_key, "zone");
    assert_eq!(w.spread.len(), 1);
    assert_eq!(w.spread[0].topology_key, "kubernetes.io/hostname");

    p["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] =
        json!(0);
    let e = pod_err(p);
    assert!(
        e.contains("preferredDuringSchedulingIgnoredDuringExecution[0].weight") && e.contains("1 to 100"),
        "{e}"
    );
}

/// Objects of kinds the plan does not read make one summary warning, not one per object.
#[test]
fn unused_kinds_are_summarised_in_one_warning() {
    let svc = |name: &str| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "web"}});
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "web"}});
    let loaded = load(vec![
        svc("a"),
        svc("b"),
        svc("c"),
        cm,
        node("n", json!({}), json!({"cpu": "4", "memory": "16Gi"})),
    ])
    .expect("loads");
    assert_eq!(
        loaded.warnings,
        vec!["objects of kinds the plan does not read, skipped: 1 ConfigMap (v1), 3 Service (v1)".to_string()]
    );
}

#[test]
fn gpu_counts_beyond_physical_sense_are_errors_naming_the_field() {
    let err = |labels: Value, alloc: Value| load(vec![node("n", labels, alloc)]).unwrap_err().to_string();
    let e = err(json!({}), json!({"cpu": "8", "nvidia.com/gpu": "1000000000"}));
    assert!(e.contains("status.allocatable.nvidia.com/gpu") && e.contains("1000000000"), "{e}");
    let e = err(json!({}), json!({"cpu": "8", "nvidia.com/gpu": "65"}));
    assert!(e.contains("at most 64"), "{e}");
    let e = err(json!({"nvidia.com/gpu.replicas": "100000"}), json!({"nvidia.com/gpu": "8"}));
    assert!(e.contains("metadata.labels[nvidia.com/gpu.replicas]"), "{e}");
    let e = err(json!({"nvidia.com/gpu.replicas": "2"}), json!({"nvidia.com/gpu": "60000"}));
    assert!(e.contains("30000 GPUs on one node"), "{e}");
    let e = err(
        json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
        json!({"nvidia.com/mig-1g.5gb": "100000"}),
    );
    assert!(e.contains("nvidia.com/mig-1g.5gb"), "{e}");
    let e = err(json!({"nvidia.com/gpu.count": "5000"}), json!({}));
    assert!(e.contains("nvidia.com/gpu.count"), "{e}");
    // 64 GPUs, and 16 GPUs time-sliced 48 ways (GKE's maximum), are fine.
    assert_eq!(one_node(node("n", json!({}), json!({"nvidia.com/gpu": "64"}))).0.gpus.len(), 64);
    let sliced =
        one_node(node("n", json!({"nvidia.com/gpu.replicas": "48"}), json!({"nvidia.com/gpu": "768"}))).0;
    assert_eq!(sliced.gpus.len(), 16);
}

#[test]
fn gke_sharing_labels_are_checked() {
    let err = |labels: Value| {
        load(vec![node("n", labels, json!({"nvidia.com/gpu": "2"}))]).unwrap_err().to_string()
    };
    let e = err(json!({"cloud.google.com/gke-gpu-sharing-strategy": "fair-share",
                       "cloud.google.com/gke-max-shared-clients-per-gpu": "2"}));
    assert!(e.contains("gke-gpu-sharing-strategy") && e.contains("time-sharing or mps"), "{e}");
    let e = err(json!({"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing"}));
    assert!(e.contains("gke-max-shared-clients-per-gpu"), "{e}");
    let e = err(json!({"cloud.google.com/gke-max-shared-clients-per-gpu": "0"}));
    assert!(e.contains("at least 1"), "{e}");
}

#[test]
fn decode_errors_name_the_same_field_both_ways() {
    let mut p = pod("ml", "train", json!([]));
    p["spec"]["priority"] = json!("high");
    let err = load(vec![p]).unwrap_err().to_string();
    assert!(err.contains("spec.priority") && err.contains("invalid type"), "{err}");
    assert!(!err.contains("line "), "positions inside an item mean nothing to the user: {err}");
}

/// A generated real-shaped List (managed fields, probes, statuses, four GPU request forms)
/// converts the same both ways, without warnings, into the cluster it was generated from.
#[test]
fn generated_lists_convert_the_same_both_ways_into_their_model() {
    use crate::sim::kubectl_list::{self, ListShape};
    let shape = ListShape { nodes: 60, running: 500, pending: 120, seed: 7, managed_fields: true };
    let (model, _) = kubectl_list::cluster(&shape);
    let mut bytes = Vec::new();
    kubectl_list::write_list(&shape, &model, &mut bytes).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let general = convert(&parse_text(Path::new("g.json"), &text).unwrap()).unwrap();
    let fast = json_list::convert("g.json", &[&text]).expect("fast path").unwrap();
    assert_eq!(
        serde_json::to_value(&general.snapshot).unwrap(),
        serde_json::to_value(&fast.snapshot).unwrap()
    );
    assert_eq!(general.warnings, fast.warnings);
    assert!(fast.warnings.is_empty(), "{:?}", fast.warnings);

    let loaded = fast.snapshot;
    assert_eq!(loaded.nodes.len(), model.nodes.len());
    for (got, want) in loaded.nodes.iter().zip(&model.nodes) {
        assert_eq!(
            (&got.name, &got.gpu_model, got.gpus.len(), &got.allocatable, &got.node_group),
            (&want.name, &want.gpu_model, want.gpus.len(), &want.allocatable, &want.node_group)
        );
        // The same GPU modes and MIG layout (the model's nodes also hold its pods; a loaded node is
        // its capacity).
        let layout = |n: &Node| -> Vec<String> {
            n.gpus
                .iter()
                .map(|g| match &g.mode {
                    GpuMode::Mig { instances, .. } => instances
                        .iter()
                        .map(|i| format!("{}@{}", i.placement.profile, i.placement.start))
                        .collect(),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(layout(got), layout(want));
    }
    assert_eq!(loaded.workloads.len(), model.workloads.len());
    let forms: std::collections::HashSet<_> =
        model.workloads.iter().map(|w| std::mem::discriminant(&w.gpu)).collect();
    assert_eq!(forms.len(), 4, "no GPU, whole, fraction and MIG demands");
    for (got, want) in loaded.workloads.iter().zip(&model.workloads) {
        assert_eq!(
            (&got.id, &got.gpu, &got.requests, &got.node_name),
            (&want.id, &want.gpu, &want.requests, &want.node_name)
        );
    }
}

/// The controller's incremental conversion gives the snapshot a one-shot conversion of the same
/// objects gives: pods converted on their own ([`PodConversion`], sizes of their PodGroups applied
/// at assembly), nodes converted again only when their resourceVersion changed; objects gone are
/// forgotten.
#[test]
fn conversions_kept_between_loops_give_the_one_shot_snapshot_and_redo_only_what_changed() {
    use crate::sim::kubectl_list::{self, ListShape};
    use k8s_openapi::api::core::v1 as core;
    let shape = ListShape { nodes: 30, running: 200, pending: 60, seed: 11, managed_fields: false };
    let (model, _) = kubectl_list::cluster(&shape);
    let mut bytes = Vec::new();
    kubectl_list::write_list(&shape, &model, &mut bytes).unwrap();
    let list: Value = serde_json::from_slice(&bytes).unwrap();
    let items = list["items"].as_array().unwrap();
    let mut nodes: Vec<core::Node> = Vec::new();
    let mut pods: Vec<core::Pod> = Vec::new();
    for item in items {
        match item["kind"].as_str() {
            Some("Node") => nodes.push(serde_json::from_value(item.clone()).unwrap()),
            Some("Pod") => pods.push(serde_json::from_value(item.clone()).unwrap()),
            other => panic!("unexpected {other:?}"),
        }
    }
    // Four pods of one namespace form a gang whose size its PodGroup says.
    let namespace = pods[0].metadata.namespace.clone().unwrap();
    for p in pods.iter_mut().filter(|p| p.metadata.namespace.as_ref() == Some(&namespace)).take(4) {
        let labels = p.metadata.labels.get_or_insert_with(Default::default);
        labels.insert("scheduling.x-k8s.io/pod-group".into(), "train".into());
    }
    let gang = json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": namespace}, "spec": {"minMember": 4}});
    // The one-shot conversion of the same objects, as `plan --snapshot` does it.
    let one_shot = |nodes: &[core::Node], pods: &[core::Pod], gang: &Value| {
        let mut objects: Vec<SourcedObject> = Vec::new();
        objects.push(SourcedObject::new("PodGroup", gang.clone()));
        let with_kind = |mut v: Value, kind: &str| {
            v["apiVersion"] = json!("v1");
            v["kind"] = json!(kind);
            v
        };
        for n in nodes {
            let origin = format!("Node {}", n.metadata.name.as_deref().unwrap());
            objects.push(SourcedObject::new(origin, with_kind(serde_json::to_value(n).unwrap(), "Node")));
        }
        for p in pods {
            let m = &p.metadata;
            let origin = format!("Pod {}/{}", m.namespace.as_deref().unwrap(), m.name.as_deref().unwrap());
            objects.push(SourcedObject::new(origin, with_kind(serde_json::to_value(p).unwrap(), "Pod")));
        }
        convert(&objects).unwrap()
    };
    let same = |a: &LoadedSnapshot, b: &LoadedSnapshot| {
        assert_eq!(serde_json::to_value(&a.snapshot).unwrap(), serde_json::to_value(&b.snapshot).unwrap());
        assert_eq!(a.warnings, b.warnings);
    };
    let mut cache = ConversionCache::default();
    let mut incremental = |nodes: &[core::Node], pods: &[core::Pod], gang: &Value| {
        let n: Vec<&core::Node> = nodes.iter().collect();
        let conversions: Vec<PodConversion> = pods.iter().cloned().map(PodConversion::new).collect();
        let p: Vec<&PodConversion> = conversions.iter().collect();
        let loaded = cache.convert(&n, &p, &[], std::slice::from_ref(gang), &[]).unwrap();
        (loaded, cache.counts)
    };
    let total = nodes.len();
    let (first, counts) = incremental(&nodes, &pods, &gang);
    same(&first, &one_shot(&nodes, &pods, &gang));
    assert_eq!(counts, ConversionCounts { converted: total, reused: 0 });

    // What the controller's stores keep of each object converts the same, and keeps what the
    // loop reads besides (versions for this cache, start times and deletion grace for drains).
    let slim_nodes: Vec<core::Node> = nodes.iter().cloned().map(slim_node).collect();
    let slim_pods: Vec<core::Pod> = pods.iter().cloned().map(slim_pod).collect();
    same(&one_shot(&slim_nodes, &slim_pods, &gang), &first);
    for (slim, full) in slim_pods.iter().zip(&pods) {
        assert!(full.metadata.resource_version.is_some());
        assert_eq!(slim.metadata.resource_version, full.metadata.resource_version);
        assert_eq!(slim.metadata.annotations, full.metadata.annotations);
        let start = |p: &core::Pod| p.status.as_ref().and_then(|s| s.start_time.clone());
        assert_eq!(start(slim), start(full));
        assert!(slim.spec.as_ref().unwrap().containers.iter().all(|c| c.env.is_none() && c.image.is_none()));
    }
    assert!(pods.iter().any(|p| p.status.as_ref().is_some_and(|s| s.start_time.is_some())));
    let with_grace = slim_pod(core::Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            deletion_grace_period_seconds: Some(30),
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(with_grace.metadata.deletion_grace_period_seconds, Some(30));
    // Of the volumes, the claims stay (they place the pod); the token and config volumes go.
    let volume = |name: &str| core::Volume { name: name.into(), ..Default::default() };
    let claim = core::Volume {
        persistent_volume_claim: Some(core::PersistentVolumeClaimVolumeSource {
            claim_name: "data".into(),
            ..Default::default()
        }),
        ..volume("data")
    };
    let ephemeral = core::Volume { ephemeral: Some(Default::default()), ..volume("scratch") };
    let token = core::Volume { projected: Some(Default::default()), ..volume("kube-api-access") };
    let with_volumes = slim_pod(core::Pod {
        spec: Some(core::PodSpec {
            volumes: Some(vec![token, claim.clone(), ephemeral.clone()]),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(with_volumes.spec.unwrap().volumes, Some(vec![claim, ephemeral]));
    assert!(
        pods.iter().any(|p| p
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .is_some_and(|v| v.iter().any(|v| v.projected.is_some()))),
        "the generator writes token volumes"
    );
    assert!(slim_nodes.iter().all(|n| n.status.as_ref().unwrap().images.is_none()));
    assert!(nodes.iter().any(|n| n.status.as_ref().unwrap().images.is_some()), "the generator writes images");
    let (again, counts) = incremental(&nodes, &pods, &gang);
    same(&again, &first);
    assert_eq!(counts, ConversionCounts { converted: 0, reused: total });

    // A pending pod asks for more; a node is gone; a pod is new.
    let pending = pods.iter().position(|p| p.spec.as_ref().unwrap().node_name.is_none()).unwrap();
    let requests = pods[pending].spec.as_mut().unwrap().containers[0].resources.as_mut().unwrap();
    requests
        .requests
        .as_mut()
        .unwrap()
        .insert("cpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("3".into()));
    pods[pending].metadata.resource_version = Some("99999999".into());
    nodes.pop();
    let mut new = pods[pending].clone();
    new.metadata.name = Some("brand-new".into());
    new.metadata.uid = Some("uid-brand-new".into());
    pods.push(new);
    let (changed, counts) = incremental(&nodes, &pods, &gang);
    same(&changed, &one_shot(&nodes, &pods, &gang));
    assert_eq!(counts, ConversionCounts { converted: 0, reused: nodes.len() });
    let cpu = |l: &LoadedSnapshot, name: &str| {
        l.snapshot.workloads.iter().find(|w| w.id.ends_with(&format!("/{name}"))).unwrap().requests.cpu_milli
    };
    assert_eq!(cpu(&changed, "brand-new"), 3000);

    // A node changes: only it is converted again.
    nodes[0].metadata.resource_version = Some("99999999".into());
    nodes[0].metadata.labels.get_or_insert_with(Default::default).insert("pool".into(), "b".into());
    let (relabelled, counts) = incremental(&nodes, &pods, &gang);
    same(&relabelled, &one_shot(&nodes, &pods, &gang));
    assert_eq!(counts, ConversionCounts { converted: 1, reused: nodes.len() - 1 });

    // A PodGroup's size changes what every pod of the gang is, though no pod changed.
    let mut bigger = gang.clone();
    bigger["spec"]["minMember"] = json!(8);
    let (regrouped, _) = incremental(&nodes, &pods, &bigger);
    same(&regrouped, &one_shot(&nodes, &pods, &bigger));
    let gang_sizes = |l: &LoadedSnapshot| -> Vec<Option<u32>> {
        l.snapshot
            .workloads
            .iter()
            .filter(|w| w.gang.is_some())
            .map(|w| w.gang_min_members)
            .collect::<Vec<_>>()
    };
    assert_eq!(gang_sizes(&first), vec![Some(4); 4]);
    assert_eq!(gang_sizes(&regrouped), vec![Some(8); 4]);

    // A pod that does not convert fails the assembly with the one-shot conversion's error.
    pods[0].spec.as_mut().unwrap().containers.clear();
    let n: Vec<&core::Node> = nodes.iter().collect();
    let broken = PodConversion::new(pods[0].clone());
    let error = cache.convert(&n, &[&broken], &[], &[], &[]).unwrap_err().to_string();
    assert!(error.contains("spec.containers"), "{error}");
    let pod = serde_json::to_value(&pods[0]).unwrap();
    let mut pod_object = pod.clone();
    pod_object["apiVersion"] = json!("v1");
    pod_object["kind"] = json!("Pod");
    let origin = format!(
        "Pod {}/{}",
        pod["metadata"]["namespace"].as_str().unwrap(),
        pod["metadata"]["name"].as_str().unwrap()
    );
    let one_shot_error = convert(&[SourcedObject::new(origin, pod_object)]).unwrap_err().to_string();
    assert_eq!(error, one_shot_error);
}

fn dra_class() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
           "spec": {"selectors": [{"cel": {"expression":
               "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}})
}

fn dra_slice(node: &str, spec_extra: Value, devices: Value) -> Value {
    let mut spec = json!({"driver": "gpu.nvidia.com", "nodeName": node,
                          "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices});
    for (k, v) in spec_extra.as_object().unwrap() {
        if v.is_null() {
            spec.as_object_mut().unwrap().remove(k);
        } else {
            spec[k] = v.clone();
        }
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"name": format!("{node}-gpu.nvidia.com-abcde")}, "spec": spec})
}

fn dra_gpu(i: u32) -> Value {
    json!({"name": format!("gpu-{i}"),
           "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA L4"}, "index": {"int": i},
                          "driverVersion": {"version": "570.124.6"}, "dra.example.com/mig": {"bool": false}},
           "capacity": {"memory": {"value": "23034Mi"}}})
}

fn dra_node(name: &str) -> Value {
    node(
        name,
        json!({"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2",
                      "nvidia.com/gpu.product": "NVIDIA-L4"}),
        json!({"cpu": "16", "memory": "64Gi", "pods": "110"}),
    )
}

fn dra_pod(name: &str, claims: Value, statuses: Value) -> Value {
    let mut p = pod(
        "ml",
        name,
        json!([{"name": "main", "image": "x",
        "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}]),
    );
    p["spec"]["resourceClaims"] = claims;
    p["status"]["resourceClaimStatuses"] = statuses;
    p
}

#[test]
fn dra_slices_give_nodes_devices_and_allocated_claims_take_them() {
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "run-gpu-x1", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "l4-a", "device": "gpu-1"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["l4-a"]}]}]}}}});
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2},
            {"name": "one", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
             "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].index >= 0"}}]}]}]}}}});
    let l = load(vec![
        dra_class(),
        dra_node("l4-a"),
        dra_slice("l4-a", json!({}), json!([dra_gpu(0), dra_gpu(1)])),
        claim,
        template,
        // Its template claim generated and allocated: the pod is pinned where it is.
        dra_pod(
            "run",
            json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
            json!([{"name": "gpu", "resourceClaimName": "run-gpu-x1"}]),
        ),
        // Not generated yet: its own claim from the template.
        dra_pod("new", json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]), Value::Null),
    ])
    .unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let n = &l.snapshot.nodes[0];
    // Ready: its GPUs come through the slice, not a device plugin that has yet to start.
    assert_eq!(n.state, NodeState::Ready);
    assert!(n.gpus.is_empty());
    assert_eq!(n.dra.devices.len(), 2);
    let d = &n.dra.devices[1];
    assert_eq!(d.id(), "gpu.nvidia.com/l4-a/gpu-1");
    use crate::model::cel::{AttrValue, Semver};
    assert_eq!(d.attributes["gpu.nvidia.com/index"], AttrValue::Int(1));
    assert_eq!(d.attributes["dra.example.com/mig"], AttrValue::Bool(false));
    assert_eq!(
        d.attributes["gpu.nvidia.com/driverVersion"],
        AttrValue::Version(Semver::parse("570.124.6").unwrap())
    );
    assert_eq!(d.capacity["gpu.nvidia.com/memory"], 23_034i128 * (1 << 20) * 1_000_000_000);
    assert_eq!(n.dra.claims["ml/run-gpu-x1"].devices, vec![1]);
    assert_eq!(n.dra.gpu_use(), (2, 1000), "two GPUs, one held");
    let run = &l.snapshot.workloads[0];
    assert_eq!(run.dra_claims[0].key, "ml/run-gpu-x1");
    assert!(run.dra_claims[0].allocated);
    assert_eq!(run.dra_claims[0].allocated_on.as_deref(), Some("l4-a"));
    let new = &l.snapshot.workloads[1];
    assert_eq!(new.dra_claims[0].key, "ml/new#gpu");
    assert!(!new.dra_claims[0].allocated);
    let alts = &new.dra_claims[0].requests[0].alternatives;
    assert_eq!(alts.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["two", "one"]);
    assert_eq!(alts[1].mode, crate::model::dra::AllocationMode::ExactCount(1));
    // The class's selector first, then the request's.
    assert_eq!(alts[1].selectors.len(), 2);
    assert!(alts[1].selectors[1].origin.contains(
        "ResourceClaimTemplate ml/one-gpu spec.spec.devices.requests[0].firstAvailable[1].selectors[0]"
    ));
}

#[test]
fn malformed_dra_objects_are_errors_naming_the_field() {
    let err = |slice: Value| load(vec![dra_node("l4-a"), slice]).unwrap_err().to_string();
    let e = err(dra_slice("l4-a", json!({"allNodes": true}), json!([dra_gpu(0)])));
    assert!(
        e.contains("ResourceSlice l4-a-gpu.nvidia.com-abcde")
            && e.contains("exactly one of nodeName, nodeSelector, allNodes"),
        "{e}"
    );
    let mut bad = dra_gpu(0);
    bad["attributes"]["index"] = json!({"int": 1, "string": "1"});
    let e = err(dra_slice("l4-a", json!({}), json!([bad])));
    assert!(e.contains("spec.devices[0].attributes[index]"), "{e}");
    let mut bad = dra_gpu(0);
    bad["capacity"]["memory"] = json!({"value": "lots"});
    let e = err(dra_slice("l4-a", json!({}), json!([bad])));
    assert!(e.contains("spec.devices[0].capacity[memory]"), "{e}");
    let mut bad = dra_gpu(0);
    bad["attributes"]["driverVersion"] = json!({"version": "570.124"});
    let e = err(dra_slice("l4-a", json!({}), json!([bad])));
    assert!(
        e.contains("spec.devices[0].attributes[driverVersion].version") && e.contains("semantic version"),
        "{e}"
    );
    let e = load(vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
                             "spec": {"selectors": [{"cel": {"expression": "device.driver = 'x'"}}]}}),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("DeviceClass c") && e.contains("spec.selectors[0].cel.expression"), "{e}");
}

#[test]
fn dra_pools_and_selectors_that_cannot_serve_are_warned_about() {
    // A device name twice makes the pool invalid (kube-scheduler allocates nothing from it).
    let l =
        load(vec![dra_node("l4-a"), dra_slice("l4-a", json!({}), json!([dra_gpu(0), dra_gpu(0)]))]).unwrap();
    assert!(
        l.warnings.iter().any(|w| w.contains("appears twice in pool gpu.nvidia.com/l4-a")),
        "{:?}",
        l.warnings
    );
    assert!(l.snapshot.nodes[0].dra.devices.is_empty());
    // A slice for a node the snapshot lacks; a node selector reaching the node.
    let l = load(vec![
        dra_node("l4-a"),
        dra_slice("gone", json!({}), json!([dra_gpu(0)])),
        dra_slice(
            "net",
            json!({"nodeName": null, "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]}]}}),
            json!([dra_gpu(7)]),
        ),
    ])
    .unwrap();
    assert!(
        l.warnings.iter().any(|w| w.contains("spec.nodeName: Node gone is not in the snapshot")),
        "{:?}",
        l.warnings
    );
    assert_eq!(
        l.snapshot.nodes[0].dra.devices.iter().map(|d| d.id()).collect::<Vec<_>>(),
        ["gpu.nvidia.com/net/gpu-7"]
    );
    // A selector that errs on a device (a missing attribute), and a class no device matches.
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].uuid == 'GPU-1'"}}]}}]}}}});
    let l = load(vec![
        dra_class(),
        dra_node("l4-a"),
        dra_slice("l4-a", json!({}), json!([dra_gpu(0)])),
        template,
        dra_pod("p", json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]), Value::Null),
    ])
    .unwrap();
    let w = l.warnings.join("\n");
    assert!(w.contains("ResourceClaimTemplate ml/t spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: on device gpu.nvidia.com/l4-a/gpu-0: CEL runtime error: no such key: uuid"), "{w}");
    assert!(w.contains("no device of the snapshot's ResourceSlices matches"), "{w}");
    // A pod naming a claim the snapshot lacks cannot be scheduled, and says why.
    let l =
        load(vec![dra_pod("q", json!([{"name": "gpu", "resourceClaimName": "nope"}]), Value::Null)]).unwrap();
    assert_eq!(l.snapshot.workloads[0].volume_blocked.as_deref(), Some("resourceclaim \"nope\" not found"));
    assert!(
        l.warnings[0].contains("add resourceclaims,resourceclaimtemplates,resourceslices,deviceclasses"),
        "{:?}",
        l.warnings
    );
}

#[test]
fn only_waiting_pods_past_the_label_bound_are_refused() {
    use k8s_openapi::api::core::v1::Pod;
    let pod = |labels: usize, node: Option<&str>| -> Pod {
        let labels: serde_json::Map<String, Value> =
            (0..labels).map(|i| (format!("l{i}"), json!("v"))).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u1", "labels": labels},
            "spec": {"containers": [{"name": "c"}], "nodeName": node},
        }))
        .unwrap()
    };
    let max = crate::limits::MAX_LABELS;
    assert_eq!(super::refuse_waiting_pod(&pod(max, None)), None);
    let refused = super::refuse_waiting_pod(&pod(max + 1, None)).expect("past the bound");
    assert_eq!(
        refused.to_string(),
        format!(
            "Pod ml/p: metadata.labels: \"more than {max} labels ({})\": at most {max} labels per object",
            max + 1
        )
    );
    assert_eq!(refused.uid.as_deref(), Some("u1"));
    // Bound to a node, it is kept: left out, the node would look emptier than it is.
    assert_eq!(super::refuse_waiting_pod(&pod(max + 1, Some("gpu-1"))), None);
}
