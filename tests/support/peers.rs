//! The real peer autoscalers — Karpenter (its kwok cloud provider) and Cluster Autoscaler (its kwok
//! provider) — and gpuscale (its controller on the simulated cloud), one at a time on a fresh real
//! control plane, given the same scenario, with the same instance types and prices (gpuscale's
//! catalog) and the same boot delay, and measured from what the API server saw (issue #46).
//!
//! The peers create Node objects themselves (no cloud, no kubelet); a kubelet stand-in here makes
//! such a node Ready [`BOOT`] after it appeared (the not-ready taint the API server's admission
//! gives every new Node keeps pods off it until then), holds its Lease in `kube-node-lease`, and
//! [`KubeCluster`]'s kubelet marks bound pods Running. gpuscale's instances register their Node at
//! launch and turn Ready [`BOOT`] later, so every autoscaler pays the same boot time and its node
//! is billed from the moment its Node exists.
//!
//! Include after the control plane, the fixtures and the cluster:
//! ```ignore
//! #[path = "support/peers.rs"]
//! mod peers;
//! ```
#![allow(dead_code)]

use crate::controlplane::Options;
use crate::kube_cluster::{fast_config, node_json, spawn_replica, ControllerConfig, KubeCluster, Replica};
use gpuscale::planner::PlannerSettings;
use gpuscale::providers::catalog;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Launch to Ready, the same for every autoscaler (real clouds take minutes; every other window
/// here is compressed likewise).
pub const BOOT: Duration = Duration::from_secs(5);
/// The one zone every instance type is offered in.
pub const ZONE: &str = "us-east-1a";
/// The instance types all three may buy in most scenarios: the L4 family of gpuscale's catalog,
/// from 1 to 8 GPUs.
pub const L4_TYPES: &[&str] =
    &["g6.xlarge", "g6.2xlarge", "g6.4xlarge", "g6.12xlarge", "g6.24xlarge", "g6.48xlarge"];
/// The MIG-capable type of the catalog with the cheapest GPUs: 8 A100-40GB.
pub const A100_TYPES: &[&str] = &["p4d.24xlarge"];
/// Seconds after which an unneeded node may go, for all three (Karpenter's `consolidateAfter`,
/// Cluster Autoscaler's `--scale-down-unneeded-time`, gpuscale's `scaleDownUnneededSeconds`).
pub const UNNEEDED_SECONDS: u64 = 10;

/// The annotation both peers' kwok providers put on the Nodes they create.
const KWOK_NODE: &str = "kwok.x-k8s.io/node";

/// What every autoscaler may buy in a scenario, and how the cluster's NVIDIA device plugin (and
/// GPU feature discovery) present those nodes' GPUs once booted, for every autoscaler's nodes
/// alike.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The instance types, one node group each (on-demand, one zone).
    pub types: &'static [&'static str],
    /// gpuscale's `gpuSharing` for every group, as YAML: `{}` (whole GPUs),
    /// `{timeSlicing: {replicas: 4}}`, `{mig: all-balanced}`. What a booted node advertises
    /// follows from it as in the test suite's kubelet ([`node_json`]), which the plan-versus-
    /// kube-scheduler tests hold to the device plugin's resource names.
    pub sharing: String,
    /// NVIDIA's DRA driver instead of its device plugin: a booted node advertises no
    /// `nvidia.com/gpu` and publishes one `gpu.nvidia.com` device per GPU in a ResourceSlice
    /// (gpuscale's groups say `dra: {}`).
    pub dra: bool,
}

impl Fleet {
    /// Whole GPUs of the L4 family.
    pub fn whole_l4() -> Fleet {
        Fleet { types: L4_TYPES, sharing: "{}".into(), dra: false }
    }
}

/// An autoscaler under test.
#[derive(Debug, Clone)]
#[allow(clippy::enum_variant_names)] // Cluster Autoscaler is the product's name
pub enum Autoscaler {
    /// gpuscale's controller with the simulated cloud.
    Gpuscale,
    /// `karpenter-kwok` at this path (its CRDs in `crds/` beside it, as scripts/peers.sh leaves them).
    Karpenter(PathBuf),
    /// `cluster-autoscaler` at this path.
    ClusterAutoscaler(PathBuf),
}

impl Autoscaler {
    /// Its name in the table.
    pub fn name(&self) -> &'static str {
        match self {
            Autoscaler::Gpuscale if gpuscale_planner().scale_down_utilization < 1.0 => {
                "gpuscale (scaleDownUtilization 0.5)"
            }
            Autoscaler::Gpuscale => "gpuscale",
            Autoscaler::Karpenter(_) if !karpenter_overlays() => "Karpenter (no NodeOverlay)",
            Autoscaler::Karpenter(_) if karpenter_dra() => "Karpenter (DRA requests on)",
            Autoscaler::Karpenter(_) => "Karpenter",
            Autoscaler::ClusterAutoscaler(_) => "Cluster Autoscaler",
        }
    }

    /// The peer of env var `var` (a binary path), or None when it is unset; a set variable that
    /// names no file is a broken setup and panics.
    pub fn from_env(var: &str, make: fn(PathBuf) -> Autoscaler) -> Option<Autoscaler> {
        let path = PathBuf::from(std::env::var_os(var)?);
        assert!(path.is_file(), "{var}={} is not a file (scripts/peers.sh builds it)", path.display());
        Some(make(path))
    }
}

/// The hourly on-demand price of `instance_type` in gpuscale's catalog.
pub fn price(instance_type: &str) -> f64 {
    catalog::lookup(instance_type)
        .and_then(|s| s.on_demand_usd)
        .unwrap_or_else(|| panic!("no catalog price for {instance_type}"))
}

/// What a node of `t` offers pods before its device plugin runs (the catalog's allocatable: the
/// same capacity for all three), with one `nvidia.com/gpu` per physical GPU.
fn resources(t: &str) -> Value {
    let spec = catalog::lookup(t).unwrap();
    let a = catalog::allocatable(spec);
    json!({
        "cpu": format!("{}m", a.cpu_milli),
        "memory": format!("{}", a.memory_bytes),
        "pods": spec.max_pods.unwrap_or(catalog::DEFAULT_MAX_PODS).to_string(),
        "nvidia.com/gpu": spec.gpus.to_string(),
    })
}

/// The GPU resources (`nvidia.com/gpu` or `nvidia.com/mig-<profile>`) and GPU feature discovery's
/// labels of a booted node of type `t` in `c`'s fleet: those of gpuscale's group of that type.
fn device_plugin_view(
    c: &KubeCluster,
    t: &str,
) -> (serde_json::Map<String, Value>, serde_json::Map<String, Value>) {
    let group =
        c.groups().into_iter().find(|g| g.instance_type == t).unwrap_or_else(|| panic!("no group of {t}"));
    let node = node_json(&group, "aws:///us-east-1a/i-template");
    let gpu_keys = |v: &Value| -> serde_json::Map<String, Value> {
        v.as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("nvidia.com/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    (gpu_keys(&node["status"]["allocatable"]), gpu_keys(&node["metadata"]["labels"]))
}

/// gpuscale's provider config: one group per type, empty, booting in no cloud time (the boot is
/// [`KubeCluster::ready_after`], from registration, as for the peers' nodes), its GPUs shared as
/// the device plugin is configured (`gpuSharing`).
pub fn gpuscale_providers(fleet: &Fleet) -> String {
    let groups: String = fleet
        .types
        .iter()
        .map(|t| {
            format!(
                "      - {{name: {}, instanceType: {t}, zones: [{ZONE}], minSize: 0, maxSize: 200, targetSize: 0, gpuSharing: {}{}}}\n",
                t.replace('.', "-"),
                fleet.sharing,
                if fleet.dra { ", dra: {}" } else { "" }
            )
        })
        .collect();
    format!(
        "accounts:\n  - name: sim\n    provider: simulated\n    region: us-east-1\n    simulation: {{bootSeconds: 0, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}}\n    nodeGroups:\n{groups}"
    )
}

/// Karpenter's instance-type file (`kwok/cloudprovider/helpers.go` `InstanceTypeOptions`), with
/// one `nvidia.com/gpu` per physical GPU whatever the sharing: Karpenter's AWS provider takes the
/// count from EC2's GPU info and has no setting for time-slicing replicas or MIG instances
/// (kubernetes-sigs/karpenter#729, open), so the kwok file says what the real provider would.
pub fn karpenter_instance_types(fleet: &Fleet) -> Value {
    let types: Vec<Value> = fleet
        .types
        .iter()
        .map(|t| {
            json!({
                "name": t, "architecture": "amd64", "operatingSystems": ["linux"],
                "resources": resources(t),
                "offerings": [{"Price": price(t), "Available": true, "Requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]}]}],
            })
        })
        .collect();
    Value::Array(types)
}

/// Whether Karpenter is given [`karpenter_node_overlays`]: yes unless
/// `GPUSCALE_PEERS_KARPENTER_OVERLAYS=off` (Karpenter as installed, which counts physical GPUs).
fn karpenter_overlays() -> bool {
    std::env::var("GPUSCALE_PEERS_KARPENTER_OVERLAYS").map_or(true, |v| v != "off")
}

/// Whether Karpenter is told to consider pods' DRA requests (`IGNORE_DRA_REQUESTS=false`, its
/// pre-GA DRA scheduling): only with `GPUSCALE_PEERS_KARPENTER_DRA=on`; as installed it ignores
/// them.
fn karpenter_dra() -> bool {
    std::env::var("GPUSCALE_PEERS_KARPENTER_DRA").is_ok_and(|v| v == "on")
}

/// Karpenter's NodeOverlays (alpha, `NodeOverlay` feature gate): for each type whose booted nodes
/// advertise GPU resources other than one `nvidia.com/gpu` per GPU (time-slicing replicas, MIG
/// instances), the resources they do advertise, which Karpenter adds to the instance type's
/// capacity (`cloudprovider.InstanceType.ApplyCapacityOverlay`, replacing a key it already has).
/// This is what a Karpenter user can declare; `nvidia.com/gpu` itself cannot be removed from a MIG
/// type.
pub fn karpenter_node_overlays(c: &KubeCluster, fleet: &Fleet) -> Vec<Value> {
    fleet
        .types
        .iter()
        .filter_map(|t| {
            let (gpu, _) = device_plugin_view(c, t);
            let physical = resources(t)["nvidia.com/gpu"].clone();
            let plain = gpu.len() == 1 && gpu.get("nvidia.com/gpu") == Some(&physical);
            (!plain).then(|| {
                json!({"apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
                    "metadata": {"name": format!("gpu-sharing-{}", t.replace('.', "-"))},
                    "spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [t]}],
                        "capacity": gpu}})
            })
        })
        .collect()
}

/// Cluster Autoscaler's kwok provider ConfigMaps: its config and one node-group template per type
/// (no prices: its kwok provider has no pricing, hence `--expander=least-waste`). The templates
/// advertise the GPU resources a booted node does (time-slicing replicas, MIG instances): on AWS a
/// Cluster Autoscaler user says so with the group's
/// `k8s.io/cluster-autoscaler/node-template/resources/<name>` tags, which override the instance
/// type's GPU count (cloudprovider/aws/aws_manager.go:280-288 at adfbe7e45277).
pub fn cluster_autoscaler_configmaps(c: &KubeCluster, fleet: &Fleet) -> [Value; 2] {
    let config = "apiVersion: v1alpha1\nreadNodesFrom: configmap\nnodegroups:\n  fromNodeLabelKey: node.kubernetes.io/instance-type\n\
         nodes:\n  skipTaint: true\n  gpuConfig:\n    gpuLabelKey: k8s.amazonaws.com/accelerator\n    availableGPUTypes:\n      nvidia-l4: {}\n\
         configmap:\n  name: kwok-provider-templates\n"
    .to_string();
    let templates: Vec<Value> = fleet
        .types
        .iter()
        .map(|t| {
            let mut res = resources(t);
            res.as_object_mut().unwrap().remove("nvidia.com/gpu");
            let (gpu, labels) = device_plugin_view(c, t);
            res.as_object_mut().unwrap().extend(gpu);
            let mut template = json!({
                "apiVersion": "v1", "kind": "Node",
                // Annotations must be a map, not absent: the provider writes into it.
                "metadata": {"name": format!("template-{}", t.replace('.', "-")),
                    "annotations": {"cluster-autoscaler.kwok.nodegroup/max-count": "200"},
                    "labels": {"node.kubernetes.io/instance-type": t, "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": ZONE,
                        "topology.kubernetes.io/region": "us-east-1",
                        "k8s.amazonaws.com/accelerator": "nvidia-l4"}},
                "status": {"capacity": res, "allocatable": res},
            });
            template["metadata"]["labels"].as_object_mut().unwrap().extend(labels);
            template
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": templates});
    let cm = |name: &str, key: &str, text: String| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "kube-system"}, "data": {key: text}})
    };
    [
        cm("kwok-provider-config", "config", config),
        cm("kwok-provider-templates", "templates", list.to_string()),
    ]
}

/// A peer process, killed (and reaped) when dropped.
pub struct Process {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Process {
    fn spawn(bin: &Path, name: &'static str, args: &[String], env: &[(&str, String)], log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(args).stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Self { child, name, log }
    }

    /// Panics with the end of its log if it has exited: a peer that does not run is a bad setup.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}); its log ends:\n{}", self.name, self.tail(40));
        }
    }

    /// How many lines of its log hold `text`.
    pub fn lines_with(&self, text: &str) -> usize {
        std::fs::read_to_string(&self.log).unwrap_or_default().lines().filter(|l| l.contains(text)).count()
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The running autoscaler.
enum Running {
    Gpuscale(Replica),
    Peer(Process),
}

/// gpuscale's controller settings: the batching windows of Karpenter's defaults (1 s idle, 10 s
/// most), the shared unneeded time.
pub fn gpuscale_config() -> ControllerConfig {
    ControllerConfig {
        batch_idle_seconds: 1.0,
        batch_max_seconds: 10.0,
        scale_down_unneeded_seconds: UNNEEDED_SECONDS as f64,
        ..fast_config()
    }
}

/// gpuscale's planner settings: its defaults, or with `GPUSCALE_PEERS_GPUSCALE_SCALE_DOWN=ca`
/// Cluster Autoscaler's scale-down rule (`scaleDownUtilization: 0.5`: only nodes less than half
/// allocated are drained).
fn gpuscale_planner() -> PlannerSettings {
    let ca_rule = std::env::var("GPUSCALE_PEERS_GPUSCALE_SCALE_DOWN").is_ok_and(|v| v == "ca");
    PlannerSettings {
        scale_down_utilization: if ca_rule { 0.5 } else { PlannerSettings::default().scale_down_utilization },
        ..PlannerSettings::default()
    }
}

async fn start(c: &Arc<KubeCluster>, a: &Autoscaler, scenario: &Scenario) -> Running {
    let fleet = &scenario.fleet;
    let dir = c.cp.dir().to_path_buf();
    let kubeconfig = c.cp.admin_kubeconfig.display().to_string();
    match a {
        Autoscaler::Gpuscale => Running::Gpuscale(spawn_replica(
            c.cp.admin.clone(),
            c.cloud.clone(),
            "a",
            gpuscale_config(),
            gpuscale_planner(),
            false,
        )),
        Autoscaler::Karpenter(bin) => {
            let crds = bin.parent().unwrap().join("crds");
            let mut names: Vec<PathBuf> = std::fs::read_dir(&crds)
                .unwrap_or_else(|e| {
                    panic!("Karpenter's CRDs at {}: {e} (scripts/peers.sh copies them)", crds.display())
                })
                .map(|e| e.unwrap().path())
                .collect();
            names.sort();
            for f in names {
                let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
                c.cp.apply(crd).await;
            }
            wait_established(
                c,
                &[
                    "nodepools.karpenter.sh",
                    "nodeclaims.karpenter.sh",
                    "nodeoverlays.karpenter.sh",
                    "kwoknodeclasses.karpenter.kwok.sh",
                ],
            )
            .await;
            let overlays: Vec<Value> =
                karpenter_node_overlays(c, fleet).into_iter().filter(|_| karpenter_overlays()).collect();
            // The gate only with overlays: with it on, Karpenter provisions nothing for a NodePool
            // until its overlay controller has run, which no event starts when there is no overlay.
            let gates = if overlays.is_empty() { "NodeOverlay=false" } else { "NodeOverlay=true" };
            for overlay in overlays {
                c.cp.apply(overlay).await;
            }
            c.cp.apply(json!({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
                "metadata": {"name": "default"}, "spec": {}}))
                .await;
            // Nothing in Karpenter sets the class Ready; without it the NodePool is ignored.
            let now = Timestamp::now().to_string();
            c.cp.raw_patch(
                "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses/default/status",
                &json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                    "message": "", "lastTransitionTime": now, "observedGeneration": 1}]}}),
            )
            .await;
            c.cp.apply(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
                "spec": {
                    "template": {"spec": {
                        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                        "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
                        "expireAfter": "Never"}},
                    "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized",
                        "consolidateAfter": format!("{UNNEEDED_SECONDS}s")}}}))
                .await;
            let types = dir.join("karpenter-instance-types.json");
            std::fs::write(&types, karpenter_instance_types(fleet).to_string()).unwrap();
            let env = [
                ("KUBECONFIG", kubeconfig),
                ("INSTANCE_TYPES_FILE_PATH", types.display().to_string()),
                ("DISABLE_LEADER_ELECTION", "true".into()),
                ("METRICS_PORT", free_port().to_string()),
                ("HEALTH_PROBE_PORT", free_port().to_string()),
                ("LOG_LEVEL", "info".into()),
                // NodeOverlay (alpha) is how a Karpenter user declares shared GPUs' capacity.
                ("FEATURE_GATES", gates.into()),
                ("IGNORE_DRA_REQUESTS", (!karpenter_dra()).to_string()),
            ];
            Running::Peer(Process::spawn(bin, "karpenter-kwok", &[], &env, dir.join("karpenter.log")))
        }
        Autoscaler::ClusterAutoscaler(bin) => {
            for cm in cluster_autoscaler_configmaps(c, fleet) {
                c.cp.apply(cm).await;
            }
            let mut args: Vec<String> = [
                "--cloud-provider=kwok",
                &format!("--kubeconfig={kubeconfig}"),
                "--namespace=kube-system",
                "--expander=least-waste",
                "--scan-interval=1s",
                &format!("--scale-down-unneeded-time={UNNEEDED_SECONDS}s"),
                "--scale-down-delay-after-add=0s",
                "--scale-down-delay-after-delete=0s",
                "--scale-down-delay-after-failure=3s",
                "--max-node-provision-time=2m",
                "--skip-nodes-with-system-pods=false",
                "--leader-elect=false",
                &format!("--address=127.0.0.1:{}", free_port()),
                "--v=2",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if scenario.kueue {
                args.push("--enable-provisioning-requests=true".into());
                // ProvisioningRequest is a CRD, which cannot be sent as protobuf, the build's
                // default: without this, every write of a request's conditions fails
                // (kubernetes/autoscaler#8855, fixed by #9546 in 2026, after this build).
                args.push("--kube-api-content-type=application/json".into());
            }
            // The kwok provider's own client reads KUBECONFIG, not --kubeconfig.
            let env = [
                ("KWOK_PROVIDER_MODE", "local".to_string()),
                ("POD_NAMESPACE", "kube-system".into()),
                ("KUBECONFIG", kubeconfig.clone()),
            ];
            Running::Peer(Process::spawn(
                bin,
                "cluster-autoscaler",
                &args,
                &env,
                dir.join("cluster-autoscaler.log"),
            ))
        }
    }
}

impl Autoscaler {
    /// Whether it serves ProvisioningRequests, so Kueue can ask it for a workload's capacity before
    /// admitting it. Karpenter does not (its docs and code have no ProvisioningRequest).
    pub fn serves_provisioning_requests(&self) -> bool {
        !matches!(self, Autoscaler::Karpenter(_))
    }

    /// Whether a launch it asks for can be made to fail here. Karpenter's kwok provider cannot:
    /// it marks every offering available (`kwok/cloudprovider/helpers.go` at v1.15.0) and its
    /// `Create` never fails for capacity, so a scenario with [`Scenario::refused`] cannot be run
    /// with it.
    pub fn can_be_refused(&self) -> bool {
        !matches!(self, Autoscaler::Karpenter(_))
    }
}

/// Kueue for `a`, as its docs set it up: one ClusterQueue with quota for the whole fleet and a
/// LocalQueue `ml/queue`; when `a` serves ProvisioningRequests, the queue's admission check asks
/// it for the capacity (`best-effort-atomic-scale-up`, GPUs managed) and Kueue admits the
/// workload once it is Provisioned. Otherwise Kueue admits on quota alone and the autoscaler sees
/// the pods when they are ungated.
async fn setup_kueue(c: &KubeCluster, a: &Autoscaler) -> crate::kueue::Kueue {
    crate::provisioning_crd::install(&c.cp).await;
    let kueue = crate::kueue::start_kueue(c).await;
    let provreq = a.serves_provisioning_requests();
    let mut objects = vec![json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "default"}, "spec": {}})];
    if provreq {
        objects.push(json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ProvisioningRequestConfig",
            "metadata": {"name": "dws"},
            "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                "managedResources": ["nvidia.com/gpu"]}}));
        objects.push(json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
            "metadata": {"name": "dws-prov"},
            "spec": {"controllerName": "kueue.x-k8s.io/provisioning-request",
                "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "dws"}}}));
    }
    let mut queue = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "gpus"},
        "spec": {"namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": "default", "resources": [
                    {"name": "cpu", "nominalQuota": "1000"},
                    {"name": "memory", "nominalQuota": "10Ti"},
                    {"name": "nvidia.com/gpu", "nominalQuota": "64"}]}]}]}});
    if provreq {
        queue["spec"]["admissionChecksStrategy"] = json!({"admissionChecks": [{"name": "dws-prov"}]});
    }
    objects.push(queue);
    objects.push(json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "queue", "namespace": "ml"}, "spec": {"clusterQueue": "gpus"}}));
    for o in objects {
        c.create(o).await;
    }
    kueue
}

/// The message AWS answers a launch it has no capacity for with.
fn insufficient_capacity(t: &str) -> String {
    format!("InsufficientInstanceCapacity: We currently do not have sufficient {t} capacity in the Availability Zone you requested ({ZONE})")
}

/// Makes every launch of `t` fail at once for `a`: gpuscale's cloud refuses the group's raises;
/// for Cluster Autoscaler's kwok provider, whose "launch" is creating the Node, a
/// ValidatingAdmissionPolicy refuses Nodes of `t`, so its `IncreaseSize` returns the error as an
/// AWS provider's does when the Auto Scaling group cannot launch.
async fn refuse(c: &KubeCluster, a: &Autoscaler, t: &str) {
    match a {
        Autoscaler::Gpuscale => {
            let group =
                c.groups().into_iter().find(|g| g.instance_type == t).expect("a group of the refused type");
            c.cloud.set_refuse_raises(&group.id, Some(&insufficient_capacity(t)))
        }
        Autoscaler::ClusterAutoscaler(_) => {
            let key = "node.kubernetes.io/instance-type";
            c.cp.apply(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": "insufficient-capacity"},
                "spec": {"failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["nodes"]}]},
                    "validations": [{"expression": format!(
                        "!has(object.metadata.labels) || !('{key}' in object.metadata.labels) || object.metadata.labels['{key}'] != '{t}'"),
                        "message": insufficient_capacity(t)}]}}))
                .await;
            c.cp.apply(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": "insufficient-capacity"},
                "spec": {"policyName": "insufficient-capacity", "validationActions": ["Deny"]}}))
                .await;
            // The policy takes effect once the API server has compiled it: probe until a Node of
            // `t` is refused.
            let probe = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "capacity-probe", "labels": {key: t}}});
            c.wait_until(Duration::from_secs(30), "the capacity policy in force", || async {
                match c.cp.raw("POST", "/api/v1/nodes", Some(probe.clone())).await {
                    Ok(_) => {
                        let _ = c.cp.raw("DELETE", "/api/v1/nodes/capacity-probe", None).await;
                        false
                    }
                    Err(e) => e.to_string().contains("InsufficientInstanceCapacity"),
                }
            })
            .await;
        }
        Autoscaler::Karpenter(_) => {
            panic!("{} cannot be refused a launch (Autoscaler::can_be_refused)", a.name())
        }
    }
}

async fn wait_established(c: &KubeCluster, crds: &[&str]) {
    for name in crds {
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
        c.wait_until(Duration::from_secs(30), &format!("CRD {name} established"), || async {
            c.get(&path).await.is_some_and(|v| {
                v["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Established" && x["status"] == "True"))
            })
        })
        .await;
    }
}

/// One thing a scenario does, in order.
#[derive(Debug, Clone)]
pub enum Step {
    /// Create this object.
    Create(Value),
    /// Wait (at most this long) until this many pods are bound, all told.
    WaitBound(usize, Duration),
    /// Set `ml/<name>` ReplicaSet's replicas.
    Scale(&'static str, u32),
    /// Wait.
    Sleep(Duration),
    /// Create this object this long after the start.
    CreateAt(Duration, Value),
    /// Delete the object at this API path (its dependents in the background) this long after
    /// the start.
    DeleteAt(Duration, String),
}

/// A scenario: steps, then measuring until `duration` after its start.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name in the table.
    pub name: String,
    /// What may be bought, and how its GPUs are shared.
    pub fleet: Fleet,
    /// What happens.
    pub steps: Vec<Step>,
    /// Length of the run (the window over which $ are counted), the same for every autoscaler.
    pub duration: Duration,
    /// An instance type the cloud has no capacity of: every launch of it is refused at once.
    pub refused: Option<&'static str>,
    /// Whether the pods are queued by Kueue ([`setup_kueue`]).
    pub kueue: bool,
}

/// A ReplicaSet `ml/<name>` of `replicas` pods, each asking `gpus` GPUs (limits too, as the device
/// plugin requires), `cpu_milli` millicores and `mem_gi` GiB.
pub fn replica_set(name: &str, replicas: u32, gpus: u32, cpu_milli: u32, mem_gi: u32) -> Value {
    replica_set_of(name, replicas, "nvidia.com/gpu", gpus, cpu_milli, mem_gi)
}

/// [`replica_set`] of pods asking `count` of the device plugin's `resource` (e.g. a MIG profile's
/// `nvidia.com/mig-1g.5gb`).
pub fn replica_set_of(
    name: &str,
    replicas: u32,
    resource: &str,
    count: u32,
    cpu_milli: u32,
    mem_gi: u32,
) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec_of(resource, count, cpu_milli, mem_gi)}}})
}

fn pod_spec(gpus: u32, cpu_milli: u32, mem_gi: u32) -> Value {
    pod_spec_of("nvidia.com/gpu", gpus, cpu_milli, mem_gi)
}

fn pod_spec_of(resource: &str, count: u32, cpu_milli: u32, mem_gi: u32) -> Value {
    json!({
        "containers": [{"name": "main", "image": "busybox", "resources": {
            "requests": {"cpu": format!("{cpu_milli}m"), "memory": format!("{mem_gi}Gi"), resource: count.to_string()},
            "limits": {resource: count.to_string()}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 1,
    })
}

/// (a) A burst of `n` one-GPU inference pods.
pub fn burst(n: u32, duration: Duration) -> Scenario {
    Scenario {
        name: format!("burst of {n} one-GPU inference pods"),
        fleet: Fleet::whole_l4(),
        steps: vec![Step::Create(replica_set("infer", n, 1, 2000, 8)), Step::WaitBound(n as usize, duration)],
        duration,
        refused: None,
        kueue: false,
    }
}

/// (b) Time-sliced inference: `n` small pods of one `nvidia.com/gpu` each (half a core, 2 GiB) on
/// GPUs the device plugin time-slices `replicas` ways, so `replicas` pods share a physical GPU.
pub fn time_sliced(n: u32, replicas: u32, duration: Duration) -> Scenario {
    Scenario {
        name: format!("{n} inference pods on GPUs time-sliced {replicas} ways"),
        fleet: Fleet {
            types: L4_TYPES,
            sharing: format!("{{timeSlicing: {{replicas: {replicas}}}}}"),
            dra: false,
        },
        steps: vec![Step::Create(replica_set("sliced", n, 1, 500, 2)), Step::WaitBound(n as usize, duration)],
        duration,
        refused: None,
        kueue: false,
    }
}

/// (b) MIG-sliced demand: `big` pods of a `3g.20gb` instance and `small` of a `1g.5gb` one, on
/// A100s that mig-parted partitions `all-balanced` (per GPU one 3g.20gb, one 2g.10gb and two
/// 1g.5gb).
pub fn mig(big: u32, small: u32, duration: Duration) -> Scenario {
    Scenario {
        name: format!("MIG: {big} x 3g.20gb + {small} x 1g.5gb pods on A100s (all-balanced)"),
        fleet: Fleet { types: A100_TYPES, sharing: "{mig: all-balanced}".into(), dra: false },
        steps: vec![
            Step::Create(replica_set_of("mig-big", big, "nvidia.com/mig-3g.20gb", 1, 4000, 16)),
            Step::Create(replica_set_of("mig-small", small, "nvidia.com/mig-1g.5gb", 1, 2000, 8)),
            Step::WaitBound((big + small) as usize, duration),
        ],
        duration,
        refused: None,
        kueue: false,
    }
}

/// (b) DRA claims: `n` inference pods (1 CPU, 4 GiB) each with a claim for one GPU of NVIDIA's
/// `gpu.nvidia.com` class, generated from a ResourceClaimTemplate, on L4 nodes whose GPUs NVIDIA's
/// DRA driver publishes (no device plugin).
pub fn dra_claims(n: u32, duration: Duration) -> Scenario {
    let mut spec = pod_spec(0, 1000, 4);
    spec["containers"][0]["resources"] =
        json!({"requests": {"cpu": "1", "memory": "4Gi"}, "claims": [{"name": "gpu"}]});
    spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]);
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "dra", "namespace": "ml"},
        "spec": {"replicas": n, "selector": {"matchLabels": {"app": "dra"}},
            "template": {"metadata": {"labels": {"app": "dra"}}, "spec": spec}}});
    Scenario {
        name: format!("DRA: {n} pods claiming one GPU each"),
        fleet: Fleet { types: L4_TYPES, sharing: "{}".into(), dra: true },
        steps: vec![
            Step::Create(crate::dra::template("one-gpu", "gpu.nvidia.com", 1, &[])),
            Step::Create(rs),
            Step::WaitBound(n as usize, duration),
        ],
        duration,
        refused: None,
        kueue: false,
    }
}

/// (e) A capacity error on the cheapest type: [`burst`] of `n` while the cloud refuses every
/// launch of g6.xlarge (as AWS answers `InsufficientInstanceCapacity`).
pub fn capacity_error(n: u32, duration: Duration) -> Scenario {
    Scenario {
        name: format!("burst of {n}, no g6.xlarge capacity"),
        refused: Some(L4_TYPES[0]),
        ..burst(n, duration)
    }
}

/// The openb trace's folder: `OPENB_TRACE_DIR`, else `../shared/traces/openb` beside the crate.
fn openb_dir() -> PathBuf {
    let candidates = [
        std::env::var_os("OPENB_TRACE_DIR").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/openb")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("openb_pod_list_default.csv").exists())
        .unwrap_or_else(|| panic!("the openb trace is not at ../shared/traces/openb (set OPENB_TRACE_DIR)"))
}

/// (f) A day of the openb trace, `speedup` times faster: the 24 hours of
/// `openb_pod_list_default.csv` holding the most GPU demand (the default replay window of
/// `gpuscale simulate --autoscale`), each pod a one-pod Job created at its arrival and deleted at
/// its departure (pods alive when the day starts arrive at once with the time they have left).
/// The fleet has whole L4 GPUs, which none of the three can share here, so a pod asking part of a
/// GPU gets a whole one (as on a cluster without a sharing layer); the trace's GPU models are not
/// kept, since only L4s are offered.
pub fn openb_day(speedup: f64) -> Scenario {
    use gpuscale::model::GpuDemand;
    use gpuscale::sim::autoscale::{busiest_window_start, jobs_from_openb};
    let path = openb_dir().join("openb_pod_list_default.csv");
    let pods = gpuscale::trace::openb::read_pods(&path).unwrap_or_else(|e| panic!("{e}"));
    let jobs = jobs_from_openb(&pods, Some(busiest_window_start(&pods, 24.0)), 24.0);
    let at = |seconds: u64| Duration::from_secs_f64(seconds as f64 / speedup);
    let mut events: Vec<(Duration, Step)> = Vec::new();
    for j in &jobs.jobs {
        let name = j.workload.id.trim_start_matches("openb/").to_string();
        let gpus = match j.workload.gpu {
            GpuDemand::None => 0,
            GpuDemand::Whole { count } | GpuDemand::Fraction { count, .. } => count,
            ref other => panic!("{name}: no whole-GPU form of {other:?}"),
        };
        let mut requests = json!({"cpu": format!("{}m", j.workload.requests.cpu_milli),
            "memory": j.workload.requests.memory_bytes.to_string()});
        let mut spec = pod_spec(0, 0, 0);
        if gpus > 0 {
            requests["nvidia.com/gpu"] = json!(gpus.to_string());
            spec["containers"][0]["resources"]["limits"] = json!({"nvidia.com/gpu": gpus.to_string()});
        } else {
            spec["containers"][0]["resources"]["limits"] = json!({});
        }
        spec["containers"][0]["resources"]["requests"] = requests;
        spec["restartPolicy"] = json!("Never");
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"template": {"metadata": {"labels": {"app": "openb"}}, "spec": spec}}});
        events.push((at(j.arrival), Step::CreateAt(at(j.arrival), job)));
        let gone = at(j.arrival + j.duration);
        if gone < at(jobs.length) {
            events.push((gone, Step::DeleteAt(gone, format!("/apis/batch/v1/namespaces/ml/jobs/{name}"))));
        }
    }
    events.sort_by_key(|(t, _)| *t);
    Scenario {
        name: format!("openb busiest day ({} pods), {speedup}x faster", jobs.jobs.len()),
        fleet: Fleet::whole_l4(),
        steps: events.into_iter().map(|(_, s)| s).collect(),
        duration: at(jobs.length) + Duration::from_secs(20),
        refused: None,
        kueue: false,
    }
}

/// (c) A training gang: a Job of `members` pods of `gpus` GPUs each, started together.
pub fn gang(members: u32, gpus: u32, duration: Duration) -> Scenario {
    let mut spec = pod_spec(gpus, 32_000, 256);
    spec["restartPolicy"] = json!("Never");
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"parallelism": members, "completions": members, "backoffLimit": 0,
            "template": {"metadata": {"labels": {"app": "train"}}, "spec": spec}}});
    Scenario {
        name: format!("{members} x {gpus}-GPU training gang"),
        fleet: Fleet::whole_l4(),
        steps: vec![Step::Create(job), Step::WaitBound(members as usize, duration)],
        duration,
        refused: None,
        kueue: false,
    }
}

/// (c) The training gang of [`gang`] queued by Kueue as one pod group of `members` pods: created
/// as Kueue's pod webhook leaves them (queue and group labels, total-count annotation, Kueue's
/// finalizer, the admission scheduling gate), admitted all at once, through a ProvisioningRequest
/// where the autoscaler serves them ([`setup_kueue`]).
pub fn gang_kueue(members: u32, gpus: u32, duration: Duration) -> Scenario {
    let mut steps: Vec<Step> = (0..members)
        .map(|i| {
            let mut spec = pod_spec(gpus, 32_000, 256);
            spec["restartPolicy"] = json!("Never");
            spec["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
            Step::Create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("train-{i}"), "namespace": "ml",
                    "labels": {"app": "train", "kueue.x-k8s.io/queue-name": "queue", "kueue.x-k8s.io/managed": "true",
                        "kueue.x-k8s.io/pod-group-name": "train"},
                    "annotations": {"kueue.x-k8s.io/pod-group-total-count": members.to_string()},
                    "finalizers": ["kueue.x-k8s.io/managed"]},
                "spec": spec}))
        })
        .collect();
    steps.push(Step::WaitBound(members as usize, duration));
    Scenario {
        name: format!("{members} x {gpus}-GPU training gang through Kueue"),
        fleet: Fleet::whole_l4(),
        steps,
        duration,
        refused: None,
        kueue: true,
    }
}

/// (d) A load drop: `from` one-GPU serving pods, then (once bound) only `to`; the rest of the
/// run is for consolidation.
pub fn load_drop(from: u32, to: u32, duration: Duration) -> Scenario {
    Scenario {
        name: format!("load drop {from} -> {to} one-GPU pods"),
        fleet: Fleet::whole_l4(),
        steps: vec![
            Step::Create(replica_set("serve", from, 1, 2000, 8)),
            Step::WaitBound(from as usize, duration),
            Step::Sleep(Duration::from_secs(3)),
            Step::Scale("serve", to),
        ],
        duration,
        refused: None,
        kueue: false,
    }
}

/// What one autoscaler did with one scenario, from the API server.
#[derive(Debug, Clone)]
pub struct Figures {
    /// The autoscaler.
    pub autoscaler: &'static str,
    /// The scenario.
    pub scenario: String,
    /// Σ node-seconds × the catalog's hourly price / 3600 over the run.
    pub cost_usd: f64,
    /// The hourly price of the nodes left at the end: the fleet the autoscaler settled on.
    pub fleet_usd_per_hour: f64,
    /// Median seconds from a pod's creation to its binding.
    pub p50_bind_s: f64,
    /// 95th percentile of the same.
    pub p95_bind_s: f64,
    /// Pods never bound: alive at the end without a node, or deleted before they had one.
    pub never_bound: usize,
    /// Nodes that appeared.
    pub launched: usize,
    /// Nodes that went before the end.
    pub removed: usize,
    /// Pods evicted through the Eviction API plus pods lost with their node without one.
    pub evicted: usize,
    /// Nodes launched per instance type.
    pub types: BTreeMap<String, usize>,
    /// GPUs over the run: seconds from its start, and the sample then.
    pub series: Vec<(f64, Sample)>,
    /// At the end: physical GPUs on the nodes, the NVIDIA devices they advertise (whole GPUs,
    /// time-slicing replicas, MIG instances: [`gpu_devices`]), and those bound pods request.
    pub gpus_end: (u64, u64, u64),
}

impl Figures {
    /// The markdown header of [`Figures::row`].
    pub fn header() -> String {
        "| scenario | autoscaler | $ (run) | $/h at end | p50 bind s | p95 bind s | never bound | nodes launched | removed | evicted | GPUs at end (phys./advertised/used) | types launched |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            .into()
    }

    /// One markdown row.
    pub fn row(&self) -> String {
        let types: Vec<String> = self.types.iter().map(|(t, n)| format!("{n}x {t}")).collect();
        format!(
            "| {} | {} | {:.4} | {:.2} | {:.1} | {:.1} | {} | {} | {} | {} | {}/{}/{} | {} |",
            self.scenario,
            self.autoscaler,
            self.cost_usd,
            self.fleet_usd_per_hour,
            self.p50_bind_s,
            self.p95_bind_s,
            self.never_bound,
            self.launched,
            self.removed,
            self.evicted,
            self.gpus_end.0,
            self.gpus_end.1,
            self.gpus_end.2,
            types.join(", ")
        )
    }
}

/// What the meter saw of one node.
#[derive(Debug, Clone)]
struct SeenNode {
    instance_type: String,
    first: Instant,
    gone: Option<Instant>,
}

/// Nodes and pods as the API server showed them, polled.
#[derive(Default)]
struct Meter {
    nodes: BTreeMap<String, SeenNode>,
    /// Pod `ns/name` -> first seen (wall clock, to compare with the audit log's binding time).
    pods: BTreeMap<String, Timestamp>,
    /// GPUs over time, one sample per poll.
    series: Vec<(Instant, Sample)>,
}

/// The GPUs of the cluster at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Physical GPUs on the nodes (from their instance types).
    pub physical: u64,
    /// NVIDIA devices the nodes advertise ([`gpu_devices`]).
    pub advertised: u64,
    /// NVIDIA devices bound pods request.
    pub used: u64,
}

/// Polls nodes and pods every 200 ms; makes the peers' nodes Ready [`BOOT`] after they appear,
/// advertising their GPUs as the fleet's device plugin does, and renews their Leases every 10 s (the kubelet and
/// device plugin stand-in for nodes no cloud instance backs).
/// With a DRA fleet it is also NVIDIA's DRA driver: each Ready node publishes its GPUs once.
fn spawn_meter(c: Arc<KubeCluster>, meter: Arc<Mutex<Meter>>, dra: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ready: BTreeSet<String> = BTreeSet::new();
        let mut renewed: BTreeMap<String, Instant> = BTreeMap::new();
        let mut published: BTreeSet<String> = BTreeSet::new();
        loop {
            let now = Instant::now();
            let mut held: Option<(u64, u64)> = None;
            let wall = Timestamp::now();
            // Errors (the control plane going away at the end of a failed test) skip a poll.
            if let Ok(list) = c.cp.raw("GET", "/api/v1/nodes", None).await {
                let items = list["items"].as_array().cloned().unwrap_or_default();
                let names: BTreeSet<String> =
                    items.iter().map(|n| n["metadata"]["name"].as_str().unwrap().to_string()).collect();
                let mut due = Vec::new();
                held = Some((
                    items.iter().map(physical_gpus).sum::<u64>(),
                    items.iter().map(|n| gpu_devices(&n["status"]["allocatable"])).sum::<u64>(),
                ));
                {
                    let mut m = meter.lock().unwrap();
                    for n in &items {
                        let name = n["metadata"]["name"].as_str().unwrap().to_string();
                        let it = n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        let seen = m.nodes.entry(name.clone()).or_insert(SeenNode {
                            instance_type: it,
                            first: now,
                            gone: None,
                        });
                        let fake = n["metadata"]["annotations"][KWOK_NODE] == "fake";
                        if fake && !ready.contains(&name) && now - seen.first >= BOOT {
                            due.push(name);
                        }
                    }
                    for (name, s) in m.nodes.iter_mut() {
                        if s.gone.is_none() && !names.contains(name) {
                            s.gone = Some(now);
                        }
                    }
                }
                for name in due {
                    if advertise_gpus(&c, &name).await && c.make_ready(&name).await {
                        ready.insert(name);
                    }
                }
                for n in items.iter().filter(|n| dra && is_ready(n)) {
                    let name = n["metadata"]["name"].as_str().unwrap().to_string();
                    if !published.contains(&name) && publish_slice(&c, n).await {
                        published.insert(name);
                    }
                }
                for name in ready.iter().filter(|n| names.contains(*n)) {
                    if renewed.get(name).is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        renew_lease(&c, name).await;
                        renewed.insert(name.clone(), Instant::now());
                    }
                }
            }
            if let Ok(list) = c.cp.raw("GET", "/api/v1/namespaces/ml/pods", None).await {
                let mut m = meter.lock().unwrap();
                let pods = list["items"].as_array().cloned().unwrap_or_default();
                for p in &pods {
                    let key = format!("ml/{}", p["metadata"]["name"].as_str().unwrap());
                    m.pods.entry(key).or_insert(wall);
                }
                if let Some((physical, advertised)) = held {
                    let used = pods.iter().map(requested_devices).sum();
                    m.series.push((now, Sample { physical, advertised, used }));
                }
            }
            if dra {
                let (published, allocated) = dra_devices(&c).await;
                if let Some((_, s)) = meter.lock().unwrap().series.last_mut().filter(|(t, _)| *t == now) {
                    s.advertised += published;
                    s.used += allocated;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Sets the GPU resources and labels of a booted peer node as the fleet's device plugin and GPU
/// feature discovery would, whatever the node was created with (a resource the plugin does not
/// advertise is removed). False when the node cannot be patched (gone).
async fn advertise_gpus(c: &KubeCluster, name: &str) -> bool {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c.cp.admin.clone());
    let Ok(node) = nodes.get(name).await else { return false };
    let labels = node.metadata.labels.unwrap_or_default();
    let Some(t) = labels.get("node.kubernetes.io/instance-type") else { return true };
    let (mut gpu, gpu_labels) = device_plugin_view(c, t);
    let status = node.status.unwrap_or_default();
    for old in status.allocatable.iter().flat_map(|a| a.keys()).filter(|k| k.starts_with("nvidia.com/")) {
        gpu.entry(old.clone()).or_insert(Value::Null);
    }
    let params = kube::api::PatchParams::default();
    let status = json!({"status": {"capacity": gpu, "allocatable": gpu}});
    let label = json!({"metadata": {"labels": gpu_labels}});
    nodes.patch_status(name, &params, &kube::api::Patch::Merge(&status)).await.is_ok()
        && nodes.patch(name, &params, &kube::api::Patch::Merge(&label)).await.is_ok()
}

fn is_ready(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Publishes the ResourceSlice NVIDIA's DRA driver writes for `node` once it runs: one
/// `gpu.nvidia.com` device per physical GPU of its instance type, owned by the Node (the garbage
/// collector removes it with the Node). False when it could not be written.
async fn publish_slice(c: &KubeCluster, node: &Value) -> bool {
    let name = node["metadata"]["name"].as_str().unwrap();
    let Some(spec) =
        node["metadata"]["labels"]["node.kubernetes.io/instance-type"].as_str().and_then(catalog::lookup)
    else {
        return true;
    };
    assert_eq!(
        spec.gpu_model.as_deref(),
        Some("L4"),
        "the DRA driver stand-in knows L4s: {}",
        spec.instance_type
    );
    let mut slice = crate::dra::slice(name, crate::dra::gpus(spec.gpus, crate::dra::L4));
    slice["metadata"]["ownerReferences"][0]["uid"] = node["metadata"]["uid"].clone();
    c.cp.raw("POST", "/apis/resource.k8s.io/v1/resourceslices", Some(slice)).await.is_ok()
}

/// Devices in ResourceSlices of Nodes that exist, and devices allocated to claims of namespace
/// `ml` that a pod holds (`reservedFor`).
async fn dra_devices(c: &KubeCluster) -> (u64, u64) {
    let items = |v: Option<Value>| v.and_then(|v| v["items"].as_array().cloned()).unwrap_or_default();
    let nodes: BTreeSet<String> = items(c.cp.raw("GET", "/api/v1/nodes", None).await.ok())
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
        .collect();
    let slices = items(c.cp.raw("GET", "/apis/resource.k8s.io/v1/resourceslices", None).await.ok());
    let published = slices
        .iter()
        .filter(|s| s["spec"]["nodeName"].as_str().is_some_and(|n| nodes.contains(n)))
        .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len) as u64)
        .sum();
    let claims =
        items(c.cp.raw("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims", None).await.ok());
    let allocated = claims
        .iter()
        .filter(|c| c["status"]["reservedFor"].as_array().is_some_and(|r| !r.is_empty()))
        .map(|c| c["status"]["allocation"]["devices"]["results"].as_array().map_or(0, Vec::len) as u64)
        .sum();
    (published, allocated)
}

async fn renew_lease(c: &KubeCluster, node: &str) {
    // A MicroTime: exactly six fractional digits.
    let t = Timestamp::now();
    let secs = Timestamp::from_second(t.as_second()).unwrap().to_string();
    let now = format!("{}.{:06}Z", secs.trim_end_matches('Z'), t.subsec_microsecond());
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}});
    c.cp.apply(lease).await;
}

/// The shared setup: a control plane with the controllers scenarios need (ReplicaSets, Jobs,
/// garbage collection), empty simulated cloud groups, kubelets.
async fn cluster(fleet: &Fleet) -> Arc<KubeCluster> {
    let controllers = vec![
        "replicaset-controller",
        "job-controller",
        "garbage-collector-controller",
        "resourceclaim-controller",
    ];
    let c = KubeCluster::start_with(
        &gpuscale_providers(fleet),
        Options { controllers, ..Default::default() },
        BOOT,
    )
    .await;
    if fleet.dra {
        for class in crate::dra::device_classes() {
            c.create(class).await;
        }
    }
    c
}

/// Runs `scenario` with `autoscaler` on a fresh control plane and measures it.
pub async fn run(autoscaler: &Autoscaler, scenario: &Scenario) -> Figures {
    let c = cluster(&scenario.fleet).await;
    if let Some(t) = scenario.refused {
        refuse(&c, autoscaler, t).await;
    }
    c.cp.ensure_namespace("kube-node-lease").await;
    let driver = c.spawn_driver(Duration::from_millis(100), 1);
    let meter = Arc::new(Mutex::new(Meter::default()));
    let meter_task = spawn_meter(c.clone(), meter.clone(), scenario.fleet.dra);
    let mut kueue = if scenario.kueue { Some(setup_kueue(&c, autoscaler).await) } else { None };
    let mut running = start(&c, autoscaler, scenario).await;
    let began = Instant::now();
    let bound = |c: Arc<KubeCluster>| async move {
        let list = c.get("/api/v1/namespaces/ml/pods").await.unwrap();
        list["items"].as_array().unwrap().iter().filter(|p| p["spec"]["nodeName"].is_string()).count()
    };
    for step in &scenario.steps {
        if let Running::Peer(p) = &mut running {
            p.assert_running();
        }
        if let Some(k) = &mut kueue {
            k.assert_running();
        }
        match step {
            Step::Create(obj) => {
                c.create(obj.clone()).await;
            }
            Step::WaitBound(n, limit) => {
                let until = began + *limit;
                while bound(c.clone()).await < *n && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Step::Scale(rs, replicas) => {
                c.cp.raw_patch(
                    &format!("/apis/apps/v1/namespaces/ml/replicasets/{rs}"),
                    &json!({"spec": {"replicas": replicas}}),
                )
                .await;
            }
            Step::Sleep(d) => tokio::time::sleep(*d).await,
            Step::CreateAt(at, obj) => {
                tokio::time::sleep_until((began + *at).into()).await;
                c.create(obj.clone()).await;
            }
            Step::DeleteAt(at, path) => {
                tokio::time::sleep_until((began + *at).into()).await;
                // Already gone is fine: the departure is what matters.
                let _ = c.cp.raw("DELETE", &format!("{path}?propagationPolicy=Background"), None).await;
            }
        }
    }
    if let Some(left) = scenario.duration.checked_sub(began.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let end = Instant::now();
    if let Running::Peer(p) = &mut running {
        p.assert_running();
    }
    meter_task.abort();
    let seen = std::mem::take(&mut *meter.lock().unwrap());
    let figures = measure(&c, autoscaler.name(), &scenario.name, &seen, began, end).await;
    if let Running::Peer(p) = &running {
        eprintln!("{} log ends:\n{}", autoscaler.name(), p.tail(5));
        if scenario.refused.is_some() {
            let refused = p.lines_with("InsufficientInstanceCapacity");
            eprintln!("{}: {refused} log lines say InsufficientInstanceCapacity", autoscaler.name());
        }
    }
    match running {
        Running::Gpuscale(r) => r.shutdown().await.expect("gpuscale's controller"),
        Running::Peer(p) => drop(p),
    }
    driver.abort();
    figures
}

async fn measure(
    c: &KubeCluster,
    autoscaler: &'static str,
    scenario: &str,
    m: &Meter,
    began: Instant,
    end: Instant,
) -> Figures {
    let mut cost_usd = 0.0;
    let mut fleet_usd_per_hour = 0.0;
    let mut types = BTreeMap::new();
    for n in m.nodes.values() {
        if n.gone.is_none_or(|g| g > end) {
            fleet_usd_per_hour += price(&n.instance_type);
        }
        let until = n.gone.unwrap_or(end).min(end);
        cost_usd += until.saturating_duration_since(n.first).as_secs_f64() * price(&n.instance_type) / 3600.0;
        *types.entry(n.instance_type.clone()).or_insert(0) += 1;
    }
    let audit = c.cp.audit();
    let mut binds: BTreeMap<String, Timestamp> = BTreeMap::new();
    for e in audit.iter().filter(|e| e.subresource == "binding" && e.code == 201) {
        if let Some(t) = e.received {
            binds.entry(format!("{}/{}", e.namespace, e.name)).or_insert(t);
        }
    }
    let mut waits: Vec<f64> = m
        .pods
        .iter()
        .filter_map(|(k, created)| {
            binds.get(k).map(|b| (b.as_millisecond() - created.as_millisecond()).max(0) as f64 / 1000.0)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        if waits.is_empty() {
            f64::NAN
        } else {
            waits[((waits.len() - 1) as f64 * q).round() as usize]
        }
    };
    let evicted =
        audit.iter().filter(|e| e.subresource == "eviction" && e.code == 201 && e.namespace == "ml").count()
            + c.killed.lock().unwrap().len();
    let pods = c.get("/api/v1/namespaces/ml/pods").await.unwrap();
    let alive: Vec<&Value> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    let alive_names: BTreeSet<String> =
        alive.iter().map(|p| format!("ml/{}", p["metadata"]["name"].as_str().unwrap())).collect();
    // Pods alive and unbound at the end, and pods deleted (a departure in the trace) before
    // they were ever bound.
    let never_bound = alive.iter().filter(|p| !p["spec"]["nodeName"].is_string()).count()
        + m.pods.keys().filter(|k| !binds.contains_key(*k) && !alive_names.contains(*k)).count();
    let used: u64 = alive.iter().copied().map(requested_devices).sum();
    let nodes = c.get("/api/v1/nodes").await.unwrap();
    let nodes = nodes["items"].as_array().unwrap();
    let mut alloc: u64 = nodes.iter().map(|n| gpu_devices(&n["status"]["allocatable"])).sum();
    let physical: u64 = nodes.iter().map(physical_gpus).sum();
    let (published, allocated) = dra_devices(c).await;
    alloc += published;
    let used = used + allocated;
    Figures {
        autoscaler,
        scenario: scenario.to_string(),
        cost_usd,
        fleet_usd_per_hour,
        p50_bind_s: pct(0.5),
        p95_bind_s: pct(0.95),
        never_bound,
        launched: m.nodes.len(),
        removed: m.nodes.values().filter(|n| n.gone.is_some_and(|g| g <= end)).count(),
        evicted,
        types,
        series: m
            .series
            .iter()
            .filter(|(t, _)| *t >= began && *t <= end)
            .map(|(t, s)| ((*t - began).as_secs_f64(), *s))
            .collect(),
        gpus_end: (physical, alloc, used),
    }
}

/// Physical GPUs of a Node, from its instance type.
fn physical_gpus(node: &Value) -> u64 {
    node["metadata"]["labels"]["node.kubernetes.io/instance-type"]
        .as_str()
        .and_then(catalog::lookup)
        .map_or(0, |spec| u64::from(spec.gpus))
}

/// The NVIDIA devices a pod holds: its request when it is bound and not terminating, else none.
fn requested_devices(pod: &Value) -> u64 {
    let holds = pod["spec"]["nodeName"].is_string() && pod["metadata"]["deletionTimestamp"].is_null();
    if holds {
        gpu_devices(&pod["spec"]["containers"][0]["resources"]["requests"])
    } else {
        0
    }
}

/// The NVIDIA devices in a resource list: `nvidia.com/gpu` (a time-slicing replica counts one)
/// and every `nvidia.com/mig-<profile>` instance.
fn gpu_devices(resources: &Value) -> u64 {
    let count = |v: &Value| v.as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    resources
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .map(|(_, v)| count(v))
        .sum()
}

/// Appends `line` to the file `GPUSCALE_PEERS_TABLE` names, if any (the table command's output).
pub fn record(line: &str) {
    println!("{line}");
    if let Some(path) = std::env::var_os("GPUSCALE_PEERS_TABLE") {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{line}").unwrap();
    }
}
