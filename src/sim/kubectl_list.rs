//! Real-shaped `kubectl get nodes,pods -A -o json` Lists of any size, for ingest benchmarks and
//! scale tests.
//!
//! The cluster comes from [`super::synthetic::cluster`]; each model object is written as the API
//! server and kubectl show it: EKS and GPU feature discovery labels, node conditions, addresses,
//! images and node info; pods with owner references, probes, environment, the projected service
//! account volume, default tolerations, conditions and container statuses. GPU demands use the
//! forms users write: `nvidia.com/gpu`, MIG resources, HAMi (`nvidia.com/gpucores` with
//! `hami-scheduler`) and KAI (`gpu-fraction` with `kai-scheduler`). `managedFields` are left out as
//! kubectl does (since 1.21) unless asked for, as a raw API list has them.

use crate::model::{ClusterSnapshot, GpuDemand, GpuMode, Node, NodeGroup, Workload};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct ListShape {
    /// GPU nodes.
    pub nodes: usize,
    /// Running pods (spread over the nodes).
    pub running: usize,
    /// Pending pods.
    pub pending: usize,
    /// Random seed: the same shape and seed give the same bytes.
    pub seed: u64,
    /// Include `metadata.managedFields`, as the API server's own lists do.
    pub managed_fields: bool,
}

/// The synthetic cluster of `shape` and its node groups (see [`super::synthetic::cluster`]), as a
/// real cluster could be: a running pod that would not fit its node beside the pods before it
/// (CPU, memory or GPUs) stays pending, as kube-scheduler would have left it.
pub fn cluster(shape: &ListShape) -> (ClusterSnapshot, Vec<NodeGroup>) {
    let (mut snapshot, groups) =
        super::synthetic::cluster(shape.nodes, shape.running, shape.pending, shape.seed);
    let index: BTreeMap<String, usize> =
        snapshot.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
    for w in &mut snapshot.workloads {
        let Some(i) = w.node_name.as_ref().and_then(|n| index.get(n)).copied() else {
            continue;
        };
        let node = &mut snapshot.nodes[i];
        match crate::scheduler::fit::replay(node, &w.gpu) {
            Ok(devices) if w.requests.fits_in(&node.free()) => node.allocate_pod(w, &devices),
            _ => w.node_name = None,
        }
    }
    (snapshot, groups)
}

/// The provider config (a simulated account) whose node groups the generated nodes belong to,
/// each group's size the number of its nodes.
pub fn provider_config(groups: &[NodeGroup]) -> String {
    super::synthetic::GROUPS
        .lines()
        .map(|line| {
            let group = groups.iter().find(|g| line.contains(&format!("{{name: {},", g.name())));
            match group {
                Some(g) => line
                    .replace("targetSize: 0", &format!("targetSize: {}", g.target_size))
                    .replace("maxSize: 3000", &format!("maxSize: {}", g.max_size)),
                None => line.to_string(),
            }
        })
        .map(|line| line + "\n")
        .collect()
}

/// Writes the `v1 List` of the nodes and pods of `shape`'s [`cluster`] to `out`, one item at a time (the whole
/// document is never held in memory).
pub fn write_list(
    shape: &ListShape,
    snapshot: &ClusterSnapshot,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(shape.seed ^ 0x6b75_6265);
    out.write_all(b"{\n    \"apiVersion\": \"v1\",\n    \"items\": [\n")?;
    let mut first = true;
    let mut item = |out: &mut dyn Write, value: &Value| -> std::io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer_pretty(&mut *out, value)?;
        Ok(())
    };
    let mut node_ips = BTreeMap::new();
    for (i, node) in snapshot.nodes.iter().enumerate() {
        let ip = format!("10.{}.{}.{}", 10 + i / 65536, (i / 256) % 256, i % 256);
        item(out, &node_object(node, &ip, shape.managed_fields, &mut rng))?;
        node_ips.insert(node.name.as_str(), ip);
    }
    for (i, w) in snapshot.workloads.iter().enumerate() {
        let host_ip = w.node_name.as_deref().and_then(|n| node_ips.get(n)).map(String::as_str);
        item(out, &pod_object(w, i, host_ip, shape.managed_fields, &mut rng))?;
    }
    out.write_all(b"\n    ],\n    \"kind\": \"List\",\n    \"metadata\": {\n        \"resourceVersion\": \"\"\n    }\n}\n")
}

fn uid(rng: &mut ChaCha8Rng) -> String {
    let b: [u8; 16] = rng.random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

fn hex(rng: &mut ChaCha8Rng, len: usize) -> String {
    (0..len).map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0')).collect()
}

/// A timestamp in March 2025, as the API server writes them.
fn timestamp(rng: &mut ChaCha8Rng) -> String {
    format!(
        "2025-03-{:02}T{:02}:{:02}:{:02}Z",
        rng.random_range(1..29),
        rng.random_range(0..24),
        rng.random_range(0..60),
        rng.random_range(0..60)
    )
}

/// `metadata.managedFields` as the API server keeps them: one entry per writer, each a tree of
/// the fields it owns.
fn managed_fields(manager: &str, subresource_status: bool, at: &str) -> Value {
    let mut entries = vec![json!({
        "apiVersion": "v1", "fieldsType": "FieldsV1", "manager": manager, "operation": "Update", "time": at,
        "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}, "f:ownerReferences": {".": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:name": {},
                "f:resources": {".": {}, "f:limits": {}, "f:requests": {}}}}, "f:tolerations": {}}}
    })];
    if subresource_status {
        entries.push(json!({
            "apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kubelet", "operation": "Update",
            "subresource": "status", "time": at,
            "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {},
                "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}}, "f:containerStatuses": {},
                "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:startTime": {}}}
        }));
    }
    Value::Array(entries)
}

fn quantity_mib(bytes: u64) -> String {
    format!("{}Mi", bytes.div_ceil(1 << 20))
}

/// GPU resources and the label/annotation form that asks for them.
fn gpu_resources(
    gpu: &GpuDemand,
    resources: &mut Map<String, Value>,
) -> (Option<&'static str>, Option<String>) {
    match gpu {
        GpuDemand::None => (None, None),
        GpuDemand::Whole { count } => {
            resources.insert("nvidia.com/gpu".into(), json!(count.to_string()));
            (None, None)
        }
        GpuDemand::Mig { profile, count } => {
            resources.insert(format!("nvidia.com/mig-{profile}"), json!(count.to_string()));
            (None, None)
        }
        GpuDemand::Fraction { count, milli, .. } if milli % 100 == 0 => {
            // HAMi: a share of cores on each of `count` GPUs.
            resources.insert("nvidia.com/gpu".into(), json!(count.to_string()));
            resources.insert("nvidia.com/gpucores".into(), json!((milli / 10).to_string()));
            (Some("hami-scheduler"), None)
        }
        GpuDemand::Fraction { milli, .. } => {
            // KAI: a fraction annotation; the pod asks no GPU resource.
            (Some("kai-scheduler"), Some(format!("{}", f64::from(*milli) / 1000.0)))
        }
        other => unreachable!("the synthetic cluster has no {other:?} demands"),
    }
}

fn pod_object(w: &Workload, i: usize, host_ip: Option<&str>, managed: bool, rng: &mut ChaCha8Rng) -> Value {
    let (namespace, name) = w.id.split_once('/').unwrap_or(("default", &w.id));
    let running = w.node_name.is_some();
    let app = format!("svc-{}", i % 97);
    let created = timestamp(rng);
    let mut limits = Map::new();
    let (scheduler, fraction) = gpu_resources(&w.gpu, &mut limits);
    let mut requests = limits.clone();
    requests.insert("cpu".into(), json!(format!("{}m", w.requests.cpu_milli)));
    requests.insert("memory".into(), json!(quantity_mib(w.requests.memory_bytes)));
    limits.insert("memory".into(), json!(quantity_mib(w.requests.memory_bytes)));
    let (owner_kind, owner_api, owner_name) = if running {
        ("ReplicaSet", "apps/v1", format!("{app}-{}", hex(rng, 10)))
    } else {
        ("Job", "batch/v1", format!("{app}-train"))
    };
    let mut labels = json!({"app": app, "app.kubernetes.io/part-of": namespace});
    if running {
        labels["pod-template-hash"] = json!(hex(rng, 10));
    } else {
        labels["batch.kubernetes.io/job-name"] = json!(owner_name);
        labels["batch.kubernetes.io/controller-uid"] = json!(uid(rng));
    }
    let mut annotations = json!({"prometheus.io/scrape": "true", "prometheus.io/port": "9090"});
    if let Some(f) = fraction {
        annotations["gpu-fraction"] = json!(f);
    }
    let mut metadata = json!({
        "annotations": annotations,
        "creationTimestamp": created,
        "generateName": format!("{owner_name}-"),
        "labels": labels,
        "name": name,
        "namespace": namespace,
        "ownerReferences": [{"apiVersion": owner_api, "blockOwnerDeletion": true, "controller": true,
            "kind": owner_kind, "name": owner_name, "uid": uid(rng)}],
        "resourceVersion": rng.random_range(1_000_000..9_000_000u32).to_string(),
        "uid": uid(rng),
    });
    if managed {
        metadata["managedFields"] = managed_fields("kube-controller-manager", running, &created);
    }
    let tolerations: Vec<Value> = w
        .tolerations
        .iter()
        .map(|t| {
            let mut v = json!({"operator": format!("{:?}", t.operator)});
            if !t.key.is_empty() {
                v["key"] = json!(t.key);
            }
            v
        })
        .chain([
            json!({"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300}),
            json!({"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300}),
        ])
        .collect();
    let image = format!("registry.example.com/{namespace}/{app}:v1.{}.{}", i % 7, i % 13);
    // The ServiceAccount admission plugin's projected token volume, mounted by its name.
    let api_access = format!("kube-api-access-{}", hex(rng, 5));
    let mut spec = json!({
        "containers": [{
            "args": ["--port=8080", "--metrics-port=9090", format!("--model=/models/{app}")],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
                {"name": "NCCL_DEBUG", "value": "WARN"},
                {"name": "OMP_NUM_THREADS", "value": "8"},
            ],
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "livenessProbe": {"failureThreshold": 3, "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                "periodSeconds": 10, "successThreshold": 1, "timeoutSeconds": 1},
            "name": "main",
            "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"},
                {"containerPort": 9090, "name": "metrics", "protocol": "TCP"}],
            "readinessProbe": {"failureThreshold": 3, "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                "periodSeconds": 5, "successThreshold": 1, "timeoutSeconds": 1},
            "resources": {"limits": limits, "requests": requests},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "volumeMounts": [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "name": api_access, "readOnly": true}],
        }],
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": true,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": w.priority,
        "restartPolicy": if running { "Always" } else { "OnFailure" },
        "schedulerName": scheduler.unwrap_or("default-scheduler"),
        "securityContext": {},
        "serviceAccount": "default",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": tolerations,
        "volumes": [{"name": api_access, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
            {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}, "path": "namespace"}]}},
        ]}}],
    });
    let condition = |t: &str, status: &str| json!({"lastProbeTime": null, "lastTransitionTime": created, "status": status, "type": t});
    let status = if let (Some(node), true) = (&w.node_name, running) {
        spec["nodeName"] = json!(node);
        let conditions: Vec<Value> =
            ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
                .iter()
                .map(|t| condition(t, "True"))
                .collect();
        let pod_ip = format!("100.{}.{}.{}", 64 + i / 65536 % 64, i / 256 % 256, i % 256);
        json!({
            "conditions": conditions,
            "containerStatuses": [{"containerID": format!("containerd://{}", hex(rng, 64)), "image": image,
                "imageID": format!("registry.example.com/{namespace}/{app}@sha256:{}", hex(rng, 64)),
                "lastState": {}, "name": "main", "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": created}}}],
            "hostIP": host_ip.unwrap_or_default(),
            "hostIPs": [{"ip": host_ip.unwrap_or_default()}],
            "phase": "Running",
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "qosClass": "Burstable",
            "startTime": created,
        })
    } else {
        json!({
            "conditions": [{"lastProbeTime": null, "lastTransitionTime": created,
                "message": "0/5000 nodes are available: 5000 Insufficient nvidia.com/gpu. preemption: 0/5000 nodes are available: 5000 No preemption victims found for incoming pod.",
                "reason": "Unschedulable", "status": "False", "type": "PodScheduled"}],
            "phase": "Pending",
            "qosClass": "Burstable",
        })
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status})
}

/// The node's allocatable resources as the kubelet and device plugins advertise them.
fn node_resources(node: &Node, reserve: bool) -> Value {
    let mut r = Map::new();
    let cpu = node.allocatable.cpu_milli;
    let mem_ki = node.allocatable.memory_bytes / 1024;
    // Capacity is allocatable plus the kubelet's reservations.
    let (cpu, mem_ki) = if reserve { (cpu, mem_ki) } else { (cpu + 90, mem_ki + 1_048_576) };
    r.insert(
        "cpu".into(),
        json!(if cpu % 1000 == 0 { format!("{}", cpu / 1000) } else { format!("{cpu}m") }),
    );
    r.insert("memory".into(), json!(format!("{mem_ki}Ki")));
    r.insert("ephemeral-storage".into(), json!("95491281146"));
    r.insert("hugepages-1Gi".into(), json!("0"));
    r.insert("hugepages-2Mi".into(), json!("0"));
    r.insert("pods".into(), json!(node.max_pods.max(110).to_string()));
    r.insert("vpc.amazonaws.com/efa".into(), json!("0"));
    let gpus = node.gpus.len();
    match node.gpus.first().map(|g| &g.mode) {
        None => {}
        Some(GpuMode::Standard) => {
            r.insert("nvidia.com/gpu".into(), json!(gpus.to_string()));
        }
        Some(GpuMode::TimeSliced { replicas }) => {
            r.insert("nvidia.com/gpu".into(), json!((gpus * *replicas as usize).to_string()));
        }
        Some(GpuMode::Mig { .. }) => {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for g in &node.gpus {
                if let GpuMode::Mig { instances, .. } = &g.mode {
                    for inst in instances {
                        *counts.entry(inst.placement.profile.as_str()).or_default() += 1;
                    }
                }
            }
            for (profile, n) in counts {
                r.insert(format!("nvidia.com/mig-{profile}"), json!(n.to_string()));
            }
        }
    }
    Value::Object(r)
}

fn node_object(node: &Node, ip: &str, managed: bool, rng: &mut ChaCha8Rng) -> Value {
    let instance_id = format!("i-{}", hex(rng, 17));
    let zone = node.zone.clone().unwrap_or_else(|| "us-east-1a".into());
    let group = node.node_group.clone().unwrap_or_default();
    let mut labels: Map<String, Value> = node.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    for (k, v) in [
        ("beta.kubernetes.io/arch", "amd64".to_string()),
        ("beta.kubernetes.io/os", "linux".to_string()),
        ("beta.kubernetes.io/instance-type", node.instance_type.clone().unwrap_or_default()),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND".to_string()),
        ("eks.amazonaws.com/nodegroup", group.clone()),
        ("eks.amazonaws.com/nodegroup-image", "ami-0b5e4e1a6c5d7f0a1".to_string()),
        ("eks.amazonaws.com/sourceLaunchTemplateId", "lt-0a1b2c3d4e5f67890".to_string()),
        ("failure-domain.beta.kubernetes.io/zone", zone.clone()),
        ("k8s.io/cloud-provider-aws", "a1b2c3d4e5f60718293a4b5c6d7e8f90".to_string()),
        ("topology.ebs.csi.aws.com/zone", zone.clone()),
        ("topology.k8s.aws/zone-id", "use1-az4".to_string()),
        ("kubernetes.io/hostname", node.name.clone()),
    ] {
        labels.insert(k.into(), json!(v));
    }
    if !node.gpus.is_empty() {
        for (k, v) in [
            ("nvidia.com/cuda.driver-version.full", "550.127.08"),
            ("nvidia.com/cuda.driver-version.major", "550"),
            ("nvidia.com/cuda.runtime-version.full", "12.4"),
            ("nvidia.com/gfd.timestamp", "1740816000"),
            ("nvidia.com/gpu.deploy.container-toolkit", "true"),
            ("nvidia.com/gpu.deploy.dcgm-exporter", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "true"),
            ("nvidia.com/gpu.deploy.driver", "pre-installed"),
            ("nvidia.com/gpu.deploy.gpu-feature-discovery", "true"),
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
            ("feature.node.kubernetes.io/kernel-version.full", "6.1.119-129.201.amzn2023.x86_64"),
        ] {
            labels.insert(k.into(), json!(v));
        }
    }
    let created = timestamp(rng);
    let mut metadata = json!({
        "annotations": {
            "alpha.kubernetes.io/provided-node-ip": ip,
            "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"{instance_id}\"}}"),
            "nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX512F,cpu-hardware_multithreading,kernel-version.full,pci-10de.present",
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        },
        "creationTimestamp": created,
        "labels": labels,
        "name": node.name,
        "resourceVersion": rng.random_range(1_000_000..9_000_000u32).to_string(),
        "uid": uid(rng),
    });
    if managed {
        metadata["managedFields"] = managed_fields("kubelet", true, &created);
    }
    let taints: Vec<Value> = node
        .taints
        .iter()
        .map(|t| json!({"key": t.key, "value": t.value, "effect": format!("{:?}", t.effect)}))
        .collect();
    let images: Vec<Value> = (0..24)
        .map(|k| {
            json!({"names": [
                format!("registry.example.com/team-{}/svc-{k}@sha256:{}", k % 17, hex(rng, 64)),
                format!("registry.example.com/team-{}/svc-{k}:v1.{}", k % 17, k % 7),
            ], "sizeBytes": rng.random_range(50_000_000..9_000_000_000u64)})
        })
        .collect();
    let condition = |t: &str, status: &str, reason: &str| {
        json!({"lastHeartbeatTime": created, "lastTransitionTime": created, "message": format!("kubelet {reason}"),
            "reason": reason, "status": status, "type": t})
    };
    let mut spec = json!({"providerID": format!("aws:///{zone}/{instance_id}")});
    if !taints.is_empty() {
        spec["taints"] = json!(taints);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": spec,
        "status": {
            "addresses": [{"address": ip, "type": "InternalIP"},
                {"address": format!("ip-{}.ec2.internal", ip.replace('.', "-")), "type": "InternalDNS"},
                {"address": format!("ip-{}.ec2.internal", ip.replace('.', "-")), "type": "Hostname"}],
            "allocatable": node_resources(node, true),
            "capacity": node_resources(node, false),
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": images,
            "nodeInfo": {"architecture": "amd64", "bootID": uid(rng), "containerRuntimeVersion": "containerd://1.7.25",
                "kernelVersion": "6.1.119-129.201.amzn2023.x86_64", "kubeProxyVersion": "v1.31.4-eks-aeac579",
                "kubeletVersion": "v1.31.4-eks-aeac579", "machineID": hex(rng, 32), "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20250128", "systemUUID": uid(rng)},
        },
    })
}
