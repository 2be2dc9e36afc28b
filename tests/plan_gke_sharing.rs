//! GKE's GPU sharing, as GKE labels its nodes and as pods select it: time-sharing and MPS
//! (`gke-gpu-sharing-strategy`, `gke-max-shared-clients-per-gpu`: `nvidia.com/gpu` counts
//! clients) and MIG partitions (`gke-gpu-partition-size`: `nvidia.com/gpu` counts partitions).
//! Supply is the physical GPUs behind the advertised units, and pending pods that select a shared
//! pool scale the group whose new nodes GKE would label so. Also: vGPU product names are not the
//! physical GPU they are carved from.

use gpuscale::k8s::SourcedObject;
use gpuscale::model::GpuMode;
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use serde_json::{json, Value};

fn gke_node(name: &str, machine: &str, accelerator: &str, extra: Value, gpus_advertised: u32) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": machine,
        "topology.kubernetes.io/zone": "us-central1-a",
        "cloud.google.com/gke-nodepool": "shared-pool",
        "cloud.google.com/gke-accelerator": accelerator,
    });
    for (k, v) in extra.as_object().unwrap() {
        labels[k] = v.clone();
    }
    let alloc =
        json!({"cpu": "7", "memory": "28Gi", "pods": "110", "nvidia.com/gpu": gpus_advertised.to_string()});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": format!("gce://proj/us-central1-a/{name}")},
        "status": {"capacity": alloc, "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// A pod asking for one `nvidia.com/gpu` on a GKE pool selected by `selector`.
fn pod(name: &str, selector: Value, node: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeSelector": selector, "containers": [{"name": "main", "image": "x", "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
        p["status"]["phase"] = json!("Running");
    }
    p
}

fn convert(objects: Vec<Value>) -> gpuscale::k8s::LoadedSnapshot {
    let objects: Vec<SourcedObject> = objects.into_iter().map(|o| SourcedObject::new("test", o)).collect();
    gpuscale::k8s::convert(&objects).expect("a valid snapshot")
}

fn plan(objects: Vec<Value>, groups_yaml: Option<&str>) -> gpuscale::planner::Plan {
    let groups = groups_yaml.map_or_else(Vec::new, |yaml| {
        gpuscale::providers::config::load_strs(&[("groups.yaml", yaml)])
            .expect("valid provider config")
            .node_groups()
    });
    let input = PlanInput {
        snapshot: convert(objects).snapshot,
        groups,
        unavailable: Default::default(),
        ..Default::default()
    };
    planner::plan(&input, &PlannerSettings { scale_down: false, ..Default::default() })
}

fn time_sharing(clients: u32) -> Value {
    json!({"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
           "cloud.google.com/gke-max-shared-clients-per-gpu": clients.to_string()})
}

#[test]
fn a_time_shared_g2_is_one_l4_shared_by_its_clients() {
    let snap = convert(vec![gke_node("g2", "g2-standard-8", "nvidia-l4", time_sharing(2), 2)]);
    let n = &snap.snapshot.nodes[0];
    assert_eq!(n.gpu_model.as_deref(), Some("L4"));
    assert_eq!(n.gpus.len(), 1, "one physical L4, not two");
    assert_eq!(n.gpus[0].mode, GpuMode::TimeSliced { replicas: 2 });

    // Two clients fit on it; a third selecting the same pool does not.
    let sel = json!({"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing"});
    let objects = vec![
        gke_node("g2", "g2-standard-8", "nvidia-l4", time_sharing(2), 2),
        pod("a", sel.clone(), Some("g2")),
        pod("b", sel.clone(), None),
        pod("c", sel, None),
    ];
    let p = plan(objects, None);
    let placed: Vec<_> = p.placements.iter().map(|x| (x.pod.as_str(), x.node.as_str())).collect();
    assert_eq!(placed, vec![("ml/b", "g2")]);
    assert_eq!(p.unschedulable.iter().map(|u| u.pod.as_str()).collect::<Vec<_>>(), vec!["ml/c"]);
}

#[test]
fn mps_clients_divide_the_advertised_count_by_the_gpus() {
    let mps = json!({"cloud.google.com/gke-gpu-sharing-strategy": "mps",
                     "cloud.google.com/gke-max-shared-clients-per-gpu": "4"});
    let snap = convert(vec![gke_node("g24", "g2-standard-24", "nvidia-l4", mps, 8)]);
    let n = &snap.snapshot.nodes[0];
    assert_eq!(n.gpus.len(), 2);
    assert!(n.gpus.iter().all(|g| g.mode == GpuMode::TimeSliced { replicas: 4 }));
}

fn partition(size: &str) -> Value {
    json!({"cloud.google.com/gke-gpu-partition-size": size})
}

fn mig_instances(n: &gpuscale::model::Node) -> Vec<Vec<String>> {
    n.gpus
        .iter()
        .map(|g| match &g.mode {
            GpuMode::Mig { instances, .. } => instances.iter().map(|i| i.placement.profile.clone()).collect(),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_partitioned_a100_is_one_gpu_with_seven_instances() {
    let snap = convert(vec![gke_node("a2", "a2-highgpu-1g", "nvidia-tesla-a100", partition("1g.5gb"), 7)]);
    let n = &snap.snapshot.nodes[0];
    assert_eq!(n.gpu_model.as_deref(), Some("A100-40GB"));
    assert_eq!(mig_instances(n), vec![vec!["1g.5gb"; 7]], "one A100 in seven partitions, not seven A100s");
    // The GPU count GKE states wins over the machine type's.
    let two = json!({"cloud.google.com/gke-gpu-partition-size": "3g.20gb", "cloud.google.com/gke-accelerator-count": "2"});
    let snap = convert(vec![gke_node("a2-2", "a2-highgpu-2g", "nvidia-tesla-a100", two, 4)]);
    assert_eq!(mig_instances(&snap.snapshot.nodes[0]), vec![vec!["3g.20gb"; 2]; 2]);
}

#[test]
fn pods_on_a_partitioned_pool_take_one_partition_each() {
    let sel = json!({"cloud.google.com/gke-gpu-partition-size": "1g.5gb"});
    let mut objects = vec![gke_node("a2", "a2-highgpu-1g", "nvidia-tesla-a100", partition("1g.5gb"), 7)];
    objects.extend((0..6).map(|i| pod(&format!("run-{i}"), sel.clone(), Some("a2"))));
    objects.push(pod("p1", sel.clone(), None));
    objects.push(pod("p2", sel, None));
    let p = plan(objects, None);
    assert_eq!(p.placements.iter().map(|x| x.pod.as_str()).collect::<Vec<_>>(), vec!["ml/p1"]);
    assert_eq!(p.unschedulable.iter().map(|u| u.pod.as_str()).collect::<Vec<_>>(), vec!["ml/p2"]);
}

const GKE_GROUPS: &str = r#"
accounts:
  - name: gke
    provider: simulated
    region: us-central1
    nodeGroups:
      - {name: a100-1g, instanceType: a2-highgpu-1g, zones: [us-central1-a], minSize: 0, maxSize: 10, targetSize: 0,
         gpuSharing: {mig: all-1g.5gb}}
      - {name: l4-ts, instanceType: g2-standard-8, zones: [us-central1-a], minSize: 0, maxSize: 10, targetSize: 0,
         gpuSharing: {timeSlicing: {replicas: 4}}}
      - {name: l4, instanceType: g2-standard-8, zones: [us-central1-a], minSize: 0, maxSize: 10, targetSize: 0}
"#;

fn scale_ups(p: &gpuscale::planner::Plan) -> Vec<(String, u32)> {
    p.scale_ups.iter().map(|s| (s.group.rsplit('/').next().unwrap().to_string(), s.to - s.from)).collect()
}

#[test]
fn pending_pods_on_a_gke_mig_pool_scale_the_partitioned_group() {
    let sel = json!({"cloud.google.com/gke-gpu-partition-size": "1g.5gb",
                     "cloud.google.com/gke-accelerator": "nvidia-tesla-a100"});
    let objects: Vec<Value> = (0..9).map(|i| pod(&format!("p{i}"), sel.clone(), None)).collect();
    let p = plan(objects, Some(GKE_GROUPS));
    assert!(p.unschedulable.is_empty(), "{:?}", p.unschedulable);
    // Nine partitions need two one-GPU nodes of seven partitions each.
    assert_eq!(scale_ups(&p), vec![("a100-1g".to_string(), 2)]);
}

#[test]
fn pending_pods_on_a_time_shared_pool_scale_the_time_shared_group() {
    let sel = json!({"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
                     "cloud.google.com/gke-max-shared-clients-per-gpu": "4"});
    let objects: Vec<Value> = (0..5).map(|i| pod(&format!("p{i}"), sel.clone(), None)).collect();
    let p = plan(objects, Some(GKE_GROUPS));
    assert!(p.unschedulable.is_empty(), "{:?}", p.unschedulable);
    assert_eq!(scale_ups(&p), vec![("l4-ts".to_string(), 2)]);
}

#[test]
fn a_vgpu_is_not_the_physical_gpu_it_is_carved_from() {
    let snap = convert(vec![vgpu_node()]);
    let n = &snap.snapshot.nodes[0];
    assert_eq!(n.gpu_model.as_deref(), Some("GRID-A100-4C"));
    assert_eq!(n.gpus.len(), 1);
    assert_eq!(n.gpus[0].memory_mib, 4 * 1024, "the vGPU's frame buffer, not an A100's 40 GB");
    assert_eq!(n.gpus[0].mode, GpuMode::Standard, "a vGPU has no MIG");
    assert!(snap.warnings.iter().any(|w| w.contains("vGPU")), "{:?}", snap.warnings);

    // A pod asking for 10 GiB of GPU memory (KAI's gpu-memory) does not fit in the vGPU's 4 GiB;
    // planned as an A100 it would have.
    let wants_10g = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "infer", "namespace": "ml", "annotations": {"gpu-memory": "10240"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "m", "image": "x"}]},
        "status": {"phase": "Pending"}
    });
    let p = plan(vec![vgpu_node(), wants_10g.clone()], None);
    assert!(p.placements.is_empty(), "{:?}", p.placements);
    let mut a100 = vgpu_node();
    a100["metadata"]["labels"]["nvidia.com/gpu.product"] = json!("NVIDIA-A100-SXM4-40GB");
    let p = plan(vec![a100, wants_10g], None);
    assert_eq!(p.placements.len(), 1, "on a physical A100 it fits: {:?}", p.unschedulable);
}

fn vgpu_node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "vm-1", "labels": {"nvidia.com/gpu.product": "GRID-A100-4C", "nvidia.com/gpu.count": "1"}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}
