//! Loading real-shaped Kubernetes snapshots (`kubectl get -o json` Lists and YAML folders).
#![cfg(feature = "k8s")]

use gpuscale::k8s::{load_snapshot, LoadedSnapshot, SnapshotError};
use gpuscale::model::mig::A100_40GB;
use gpuscale::model::{GpuDemand, GpuMode, Node, NodeState, OwnerKind, Workload};
use std::path::{Path, PathBuf};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Loads a snapshot and applies the running pods' recorded devices to their nodes, as the
/// planner does (the loader returns nodes with their capacity only).
fn load(rel: &str) -> LoadedSnapshot {
    let path = data(rel);
    let mut s = load_snapshot(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    assert!(s
        .snapshot
        .nodes
        .iter()
        .all(|n| n.allocated.cpu_milli == 0 && n.gpus.iter().all(|g| g.is_idle())));
    for w in &s.snapshot.workloads {
        let (Some(name), Some(devices)) = (&w.node_name, &w.devices) else { continue };
        if let Some(n) = s.snapshot.nodes.iter_mut().find(|n| &n.name == name) {
            n.allocate(&w.requests, devices);
        }
    }
    s
}

fn node<'a>(s: &'a LoadedSnapshot, name: &str) -> &'a Node {
    s.snapshot.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("node {name}"))
}

fn workload<'a>(s: &'a LoadedSnapshot, id: &str) -> &'a Workload {
    s.snapshot.workloads.iter().find(|w| w.id == id).unwrap_or_else(|| panic!("workload {id}"))
}

fn mig_used(n: &Node) -> Vec<String> {
    let mut used = Vec::new();
    for g in &n.gpus {
        if let GpuMode::Mig { instances, .. } = &g.mode {
            used.extend(instances.iter().filter(|i| i.used).map(|i| i.placement.profile.clone()));
        }
    }
    used.sort();
    used
}

#[test]
fn kubectl_list_of_a_gpu_cluster() {
    let s = load("tests/data/snapshots/cluster.json");
    assert_eq!(s.snapshot.nodes.len(), 5);
    assert_eq!(s.snapshot.workloads.len(), 12, "the Succeeded job pod is dropped");
    assert!(s
        .warnings
        .iter()
        .any(|w| w.contains("kinds the plan does not read") && w.contains("1 Service (v1)")));

    // MIG mixed strategy, all-balanced on 8x A100-40GB, with three instances in use.
    let a100 = node(&s, "ip-10-0-12-34.ec2.internal");
    assert_eq!(a100.gpu_model.as_deref(), Some("A100-40GB"));
    assert_eq!(a100.state, NodeState::Ready);
    assert_eq!(a100.node_group.as_deref(), Some("gpu-a100-mig"));
    assert_eq!(a100.zone.as_deref(), Some("us-east-1a"));
    assert_eq!(a100.instance_type.as_deref(), Some("p4d.24xlarge"));
    assert!(a100.provider_id.as_deref().unwrap().starts_with("aws:///us-east-1a/i-"));
    assert_eq!(a100.gpus.len(), 8);
    for g in &a100.gpus {
        let GpuMode::Mig { instances, dynamic } = &g.mode else {
            panic!("GPU {} is not in MIG mode", g.index)
        };
        assert!(!dynamic);
        let layout: Vec<_> = instances.iter().map(|i| i.placement.clone()).collect();
        A100_40GB.validate(&layout).unwrap();
        assert_eq!(layout.len(), 4, "2x 1g.5gb + 2g.10gb + 3g.20gb");
    }
    assert_eq!(mig_used(a100), ["1g.5gb", "3g.20gb", "3g.20gb"]);
    assert_eq!(a100.allocated.cpu_milli, 9000);
    assert_eq!(a100.allocatable.cpu_milli, 95_690);
    assert_eq!(a100.topology.nvlink_domain.len(), 8);

    // Time-sliced T4: 4 replicas, two whisper pods hold two of them.
    let t4 = node(&s, "ip-10-0-40-7.ec2.internal");
    assert_eq!(t4.gpu_model.as_deref(), Some("T4"));
    assert_eq!(t4.gpus.len(), 1);
    assert_eq!(t4.gpus[0].mode, GpuMode::TimeSliced { replicas: 4 });
    assert_eq!(t4.gpus[0].used_replicas, 2);
    assert_eq!(t4.gpus[0].memory_mib, 15_360);
    assert_eq!(t4.allocated.cpu_milli, 1050, "two 500m pods and the device plugin");

    // HAMi: four physical A10Gs, the vGPU pod on the GPU HAMi recorded.
    let hami = node(&s, "ip-10-0-77-21.ec2.internal");
    assert_eq!(hami.gpu_model.as_deref(), Some("A10G"));
    assert_eq!(hami.gpus.len(), 4);
    assert!(hami.gpus.iter().all(|g| g.mode == GpuMode::Standard));
    assert_eq!(hami.gpus[2].used_milli, 300);
    assert_eq!(hami.gpus[2].used_memory_mib, 8000);
    assert_eq!(hami.idle_gpus(), 3);
    assert_eq!(hami.topology.numa, vec![0, 0, 1, 1]);

    // Registered and Ready, but MIG manager still pending: in-flight capacity of 8 GPUs.
    let init = node(&s, "ip-10-0-13-90.ec2.internal");
    assert_eq!(init.state, NodeState::Initializing);
    assert_eq!(init.gpus.len(), 8);
    assert_eq!(init.gpu_model.as_deref(), Some("A100-40GB"));

    let cpu = node(&s, "ip-10-0-5-11.ec2.internal");
    assert!(cpu.scale_down_disabled);
    assert!(cpu.gpus.is_empty());
    assert_eq!(cpu.gpu_model, None);
    // api pod: max(750m, init 2) CPU, max(1536Mi, 512Mi) memory.
    assert_eq!(cpu.allocated.cpu_milli, 2000);
    assert_eq!(cpu.allocated.memory_bytes, 1536 << 20);

    let bert = workload(&s, "ml-inference/bert-serving-6c8f9d7b54-x2lqp");
    assert_eq!(bert.gpu, GpuDemand::Mig { profile: "3g.20gb".into(), count: 1 });
    assert_eq!(bert.priority, 100_000);
    assert_eq!(bert.owner, OwnerKind::ReplicaSet);
    assert_eq!(bert.eviction_blocked.as_deref(), Some("karpenter.sh/do-not-disrupt=true"));
    assert_eq!(bert.tolerations.len(), 3);

    let notebook = workload(&s, "ml-dev/notebook-alice-0");
    assert_eq!(
        notebook.gpu,
        GpuDemand::Mig { profile: "1g.5gb".into(), count: 1 },
        "limits stand in for missing extended-resource requests"
    );
    assert_eq!(notebook.owner, OwnerKind::StatefulSet);

    let whisper = workload(&s, "ml-inference/whisper-small-5d4b8c9f7-pq2mz");
    assert_eq!(whisper.gpu, GpuDemand::Whole { count: 1 });

    let vgpu = workload(&s, "research/vgpu-llm-eval-7f9c6b5d8-2wqsn");
    assert_eq!(vgpu.gpu, GpuDemand::Fraction { count: 1, milli: 300, memory_mib: 8000 });
    assert_eq!(vgpu.tenant.as_deref(), Some("research-nlp"));

    let kai = workload(&s, "research/kai-embed-batch-x7k2p");
    assert_eq!(kai.gpu, GpuDemand::Fraction { count: 1, milli: 500, memory_mib: 0 });
    assert_eq!(kai.node_name, None);
    assert_eq!(kai.tenant.as_deref(), Some("research-batch"));
    assert_eq!(kai.owner, OwnerKind::Job);

    let gang: Vec<&Workload> =
        s.snapshot.workloads.iter().filter(|w| w.gang.as_deref() == Some("ml-train/resnet-ddp")).collect();
    assert_eq!(gang.len(), 3);
    for w in &gang {
        assert_eq!(w.gang_min_members, Some(2), "from the PodGroup");
        assert_eq!(w.gang_topology_key.as_deref(), Some("topology.kubernetes.io/zone"));
        assert_eq!(w.owner, OwnerKind::Other("PyTorchJob".into()));
        assert!(w.node_name.is_none());
    }
    assert_eq!(gang[0].created_at, Some(1_740_994_200));

    let ds = workload(&s, "kube-system/nvidia-device-plugin-daemonset-7xk2m");
    assert_eq!(ds.owner, OwnerKind::DaemonSet);
    assert_eq!(ds.affinity_terms[0][0].key, "kubernetes.io/hostname");
    assert!(ds.allowed_on(t4));

    assert_eq!(s.snapshot.pending().count(), 4);

    let pdb = &s.snapshot.disruption_budgets[0];
    assert_eq!(pdb.id, "ml-inference/bert-serving");
    assert_eq!(pdb.disruptions_allowed, 1);
    assert!(pdb.covers(bert));
    assert!(!pdb.covers(whisper));
}

#[test]
fn yaml_folder_gives_the_same_snapshot() {
    let json = load("tests/data/snapshots/cluster.json");
    let yaml = load("tests/data/snapshots/yaml-folder");
    assert_eq!(serde_json::to_value(&yaml.snapshot).unwrap(), serde_json::to_value(&json.snapshot).unwrap());
    assert_eq!(yaml.warnings, json.warnings, "the same objects, the same summary");
}

fn load_err(rel: &str) -> SnapshotError {
    match load_snapshot(&data(rel)) {
        Ok(_) => panic!("{rel} loaded"),
        Err(e) => e,
    }
}

#[test]
fn malformed_json_names_file_and_line() {
    let err = load_err("tests/data/snapshots/malformed/bad-syntax.json");
    let msg = err.to_string();
    match err {
        SnapshotError::Json { path, line, .. } => {
            assert!(path.ends_with("bad-syntax.json"));
            assert_eq!(line, 13, "{msg}");
        }
        other => panic!("{other}"),
    }
    assert!(msg.contains("bad-syntax.json:13:"), "{msg}");
}

#[test]
fn malformed_yaml_names_file_and_line() {
    let err = load_err("tests/data/snapshots/malformed/bad-syntax.yaml");
    let msg = err.to_string();
    match err {
        SnapshotError::Yaml { path, line, .. } => {
            assert!(path.ends_with("bad-syntax.yaml"));
            assert_eq!(line, 15, "{msg}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn bad_quantities_name_object_field_and_value() {
    let err = load_err("tests/data/snapshots/malformed/bad-quantity.json");
    let msg = err.to_string();
    assert!(msg.contains("bad-quantity.json"), "{msg}");
    assert!(msg.contains("Node ip-10-0-5-11.ec2.internal"), "{msg}");
    assert!(msg.contains("status.allocatable.memory"), "{msg}");
    assert!(msg.contains("\"61736Mb\""), "{msg}");

    let err = load_err("tests/data/snapshots/malformed/bad-quantity-pod.yaml");
    match &err {
        SnapshotError::Quantity { origin, object, field, value, .. } => {
            assert!(origin.ends_with("bad-quantity-pod.yaml"));
            assert_eq!(object, "Pod ml-train/resnet-ddp-worker-0");
            assert_eq!(field, "spec.containers[0].resources.requests.memory");
            assert_eq!(value, "64 Gi");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn missing_paths_and_empty_folders() {
    let err = load_err("tests/data/snapshots/does-not-exist.json");
    assert!(matches!(&err, SnapshotError::Io { path, .. } if path.ends_with("does-not-exist.json")));
    let dir = tempfile::tempdir().unwrap();
    let err = load_snapshot(dir.path()).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::NotObjects { reason, .. } if reason.contains("no *.json")),
        "{err}"
    );
}

/// Input that holds no Kubernetes objects is an error naming the file and what is there (a
/// failed `kubectl` export must not read as an empty cluster and drain everything); only a
/// well-formed List may be empty (issue #28's exit-2 contract).
#[test]
fn input_that_is_not_kubernetes_objects_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, says) in [
        ("empty.json", "", "no Kubernetes objects"),
        ("blank.yaml", "\n---\n", "no Kubernetes objects"),
        ("null.json", "null", "no Kubernetes objects"),
        ("array.json", "[]", "no Kubernetes objects"),
        ("object.json", "{}", "no kind"),
        ("items-null.json", r#"{"apiVersion":"v1","kind":"List","items":null}"#, "items: null"),
        ("item-null.json", r#"{"apiVersion":"v1","kind":"List","items":[null]}"#, "items[0]: null"),
        ("no-kind.yaml", "metadata: {name: x}\n", "no kind"),
        ("providers.yaml", "accounts:\n  - name: a\n    provider: simulated\n", "no kind"),
        ("scalar.yaml", "just text\n", "no kind"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let err = load_snapshot(&path).unwrap_err();
        assert!(
            matches!(err, SnapshotError::NotObjects { .. } | SnapshotError::Empty { .. }),
            "{name}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(name) && msg.contains(says), "{name}: {msg}");
    }
    let path = dir.path().join("empty-list.json");
    std::fs::write(&path, r#"{"apiVersion":"v1","kind":"List","items":[]}"#).unwrap();
    let empty = load_snapshot(&path).expect("a List that says the cluster is empty");
    assert!(empty.snapshot.nodes.is_empty() && empty.snapshot.workloads.is_empty());
}

#[test]
fn single_object_and_multi_document_files() {
    let dir = tempfile::tempdir().unwrap();
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"karpenter.sh/nodepool":"default"}},
        "status":{"allocatable":{"cpu":"2","memory":"8Gi"},"conditions":[{"type":"Ready","status":"True"}]}}"#;
    let path = dir.path().join("node.json");
    std::fs::write(&path, node).unwrap();
    let s = load_snapshot(&path).unwrap();
    assert_eq!(s.snapshot.nodes[0].node_group.as_deref(), Some("default"));

    let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  namespace: x\nspec:\n  containers:\n  - name: c\n    resources:\n      requests:\n        cpu: 1.5\n        memory: 1e9\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n  namespace: x\nspec:\n  containers:\n  - name: c\n";
    let path = dir.path().join("pods.yml");
    std::fs::write(&path, yaml).unwrap();
    let s = load_snapshot(&path).unwrap();
    assert_eq!(s.snapshot.workloads.len(), 2);
    assert_eq!(s.snapshot.workloads[0].requests.cpu_milli, 1500);
    assert_eq!(s.snapshot.workloads[0].requests.memory_bytes, 1_000_000_000);
}

#[test]
fn example_snapshot_is_a_realistic_mixed_gpu_cluster() {
    let s = load("examples/snapshots/mixed-gpu-cluster.json");
    let groups = |g: &str| -> Vec<&Node> {
        s.snapshot.nodes.iter().filter(|n| n.node_group.as_deref() == Some(g)).collect()
    };
    for (group, instance_type, model) in [
        ("gpu-a100-mig", "p4d.24xlarge", Some("A100-40GB")),
        ("gpu-h100", "p5.48xlarge", Some("H100-80GB")),
        ("gpu-l4-ts", "g6.12xlarge", Some("L4")),
        ("cpu-general", "m6i.4xlarge", None),
    ] {
        let nodes = groups(group);
        assert!(nodes.len() >= 2, "{group}");
        for n in nodes {
            assert_eq!(n.instance_type.as_deref(), Some(instance_type));
            assert_eq!(n.gpu_model.as_deref(), model);
            assert_eq!(n.state, NodeState::Ready);
            assert!(matches!(n.zone.as_deref(), Some("us-east-1a" | "us-east-1b")));
        }
    }
    assert!(groups("gpu-l4-ts")
        .iter()
        .all(|n| n.gpus.len() == 4 && n.gpus.iter().all(|g| g.mode == GpuMode::TimeSliced { replicas: 4 })));
    assert!(groups("gpu-h100").iter().all(|n| n.gpus.len() == 8));
    assert!(groups("gpu-a100-mig")
        .iter()
        .all(|n| n.gpus.len() == 8 && n.gpus.iter().all(|g| matches!(g.mode, GpuMode::Mig { .. }))));

    let kinds = |pending: bool| -> Vec<&'static str> {
        let mut k: Vec<&'static str> = s
            .snapshot
            .workloads
            .iter()
            .filter(|w| w.node_name.is_none() == pending)
            .map(|w| match w.gpu {
                GpuDemand::None => "none",
                GpuDemand::Whole { .. } => "whole",
                GpuDemand::Mig { .. } => "mig",
                GpuDemand::Fraction { .. } => "fraction",
                GpuDemand::Shared { .. } => "shared",
            })
            .collect();
        k.sort();
        k.dedup();
        k
    };
    for kind in ["mig", "whole", "none"] {
        assert!(kinds(true).contains(&kind), "pending {kind}");
        assert!(kinds(false).contains(&kind), "running {kind}");
    }
    // Running and pending pods on the time-sliced L4 group.
    let on_l4 = |w: &&Workload| {
        w.node_selector.get("eks.amazonaws.com/nodegroup").map(String::as_str) == Some("gpu-l4-ts")
    };
    assert!(s.snapshot.workloads.iter().filter(on_l4).any(|w| w.node_name.is_some()));
    assert!(s.snapshot.workloads.iter().filter(on_l4).any(|w| w.node_name.is_none()));

    let gang: Vec<&Workload> =
        s.snapshot.workloads.iter().filter(|w| w.gang.as_deref() == Some("ml-train/gpt-pretrain")).collect();
    assert_eq!(gang.len(), 4);
    assert!(gang.iter().all(|w| w.gang_min_members == Some(4)
        && w.gpu == GpuDemand::Whole { count: 8 }
        && w.node_name.is_none()));
    assert_eq!(s.snapshot.disruption_budgets.len(), 2);
    // Everything bound fits where it is: no accounting warnings.
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}
