//! Real-shaped DRA objects as `kubectl get -o json` shows them: ResourceSlices as NVIDIA's DRA
//! driver (`gpu.nvidia.com`) publishes them for H100, A100 (MIG) and L4 nodes, DeviceClasses as
//! its Helm chart installs them, claims and templates as users write them.
#![allow(dead_code)]

use serde_json::{json, Value};

/// `(instance type, GFD product label, productName, architecture, cuda cc, memory)`.
pub const H100: (&str, &str, &str, &str, &str, &str) =
    ("p5.48xlarge", "NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi");
pub const A100: (&str, &str, &str, &str, &str, &str) =
    ("p4d.24xlarge", "NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40960Mi");
pub const L4: (&str, &str, &str, &str, &str, &str) =
    ("g6.12xlarge", "NVIDIA-L4", "NVIDIA L4", "Ada Lovelace", "8.9.0", "23034Mi");

pub fn device_classes() -> Vec<Value> {
    let class = |name: &str, kind: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
               "spec": {"selectors": [{"cel": {"expression":
                 format!("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'")}}]}})
    };
    vec![class("gpu.nvidia.com", "gpu"), class("mig.nvidia.com", "mig")]
}

/// A Ready EKS node of `kind` in group `group`; `plugin_gpus` advertised as `nvidia.com/gpu`.
pub fn node(
    name: &str,
    kind: (&str, &str, &str, &str, &str, &str),
    group: &str,
    gpus: u32,
    plugin_gpus: u32,
) -> Value {
    let mut alloc = json!({"cpu": "191450m", "memory": "2000Gi", "pods": "737"});
    if plugin_gpus > 0 {
        alloc["nvidia.com/gpu"] = json!(plugin_gpus.to_string());
    }
    json!({"apiVersion": "v1", "kind": "Node",
      "metadata": {"name": name, "labels": {
          "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": kind.0,
          "topology.kubernetes.io/zone": "us-east-1a", "eks.amazonaws.com/nodegroup": group,
          "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": kind.1, "nvidia.com/gpu.count": gpus.to_string()}},
      "spec": {"providerID": format!("aws:///us-east-1a/i-{name}")},
      "status": {"allocatable": alloc, "capacity": alloc,
                 "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
}

pub fn gpu_device(i: u32, kind: (&str, &str, &str, &str, &str, &str)) -> Value {
    json!({"name": format!("gpu-{i}"), "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": format!("GPU-{i:08x}-7c1e-4f2a-9a43-3b1d2c0e{i:04x}")},
        "productName": {"string": kind.2}, "brand": {"string": "Nvidia"}, "architecture": {"string": kind.3},
        "cudaComputeCapability": {"version": kind.4}, "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"}, "pcieBusID": {"string": format!("0000:{:02x}:00.0", 0x18 + i)},
        "index": {"int": i}, "minor": {"int": i}},
      "capacity": {"memory": {"value": kind.5}}})
}

pub fn mig_device(gpu: u32, profile: &str, profile_id: u32, start: u32, size: u32, memory: &str) -> Value {
    json!({"name": format!("gpu-{gpu}-mig-{profile_id}-{start}-{size}"), "attributes": {
        "type": {"string": "mig"}, "uuid": {"string": format!("MIG-{gpu}-{start}-{size}")},
        "parentUUID": {"string": format!("GPU-{gpu:08x}")}, "profile": {"string": profile},
        "productName": {"string": A100.2}, "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"}, "driverVersion": {"version": "570.124.6"}},
      "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": "14"}}})
}

pub fn slice(node: &str, devices: Vec<Value>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
      "metadata": {"name": format!("{node}-gpu.nvidia.com-x7k2p"),
                   "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": "1"}]},
      "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
               "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
}

pub fn gpus(n: u32, kind: (&str, &str, &str, &str, &str, &str)) -> Vec<Value> {
    (0..n).map(|i| gpu_device(i, kind)).collect()
}

pub fn template(name: &str, class: &str, count: u32, selectors: &[&str]) -> Value {
    let sel: Vec<Value> = selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
      "metadata": {"name": name, "namespace": "ml"},
      "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
          "deviceClassName": class, "allocationMode": "ExactCount", "count": count, "selectors": sel}}]}}}})
}

pub fn claim(name: &str, class: &str, count: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
      "metadata": {"name": name, "namespace": "ml"},
      "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
          "deviceClassName": class, "allocationMode": "ExactCount", "count": count}}]}}})
}

/// A claim allocated to `devices` of `node` and reserved for `pod` (as kube-scheduler writes it).
pub fn allocated(mut c: Value, node: &str, devices: &[&str], pod: &str) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": node, "device": d}))
        .collect();
    c["status"] = json!({"allocation": {"devices": {"results": results},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}]});
    c
}

/// A pod using `claim` through a template (`template: true`) or by name.
pub fn pod(name: &str, claim: &str, from_template: bool) -> Value {
    let rc = if from_template {
        json!({"name": "gpus", "resourceClaimTemplateName": claim})
    } else {
        json!({"name": "gpus", "resourceClaimName": claim})
    };
    json!({"apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": name, "namespace": "ml", "labels": {"app": "train"}},
      "spec": {"resourceClaims": [rc], "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
          "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "claims": [{"name": "gpus"}]}}]},
      "status": {"phase": "Pending"}})
}

pub fn bound(mut p: Value, node: &str) -> Value {
    p["spec"]["nodeName"] = json!(node);
    p["status"]["phase"] = json!("Running");
    p
}
