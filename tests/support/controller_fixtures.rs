//! What the controller tests share, whichever API server they run against: node and pod fixtures,
//! test-sized controller settings, a replica started on a client, and an observer recording what
//! the controller reported.
#![allow(dead_code)]

pub use gpuscale::controller::config::ControllerConfig;
use gpuscale::controller::providers::ProviderSet;
use gpuscale::controller::reconcile::{Controller, ControllerError, ControllerOptions};
use gpuscale::controller::Observer;
use gpuscale::model::{ClusterSnapshot, GpuMode, NodeGroup};
use gpuscale::planner::{Plan, PlannerSettings};
use gpuscale::providers::simulated::SimulatedCloud;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Namespace of the controller's Lease in the tests.
pub const LEASE_NAMESPACE: &str = "kube-system";

/// Node name of an instance: the last path segment of its provider id.
pub fn node_name(instance: &str) -> String {
    instance.rsplit('/').next().unwrap_or(instance).to_ascii_lowercase()
}

fn zone_of(instance: &str) -> Option<String> {
    // aws:///us-east-1a/i-..., gce://project/zone/name
    let parts: Vec<&str> = instance.split('/').filter(|s| !s.is_empty()).collect();
    (parts.len() >= 3).then(|| parts[parts.len() - 2].to_string())
}

/// The Node a kubelet of `group` would register for `instance` (not yet Ready).
pub fn node_json(group: &NodeGroup, instance: &str) -> Value {
    let t = &group.template;
    let mut labels: BTreeMap<String, String> = (*t.labels).clone();
    labels.insert("gpuscale.io/node-group".into(), group.name().to_string());
    labels.insert("node.kubernetes.io/instance-type".into(), group.instance_type.clone());
    labels.insert("kubernetes.io/hostname".into(), node_name(instance));
    if let Some(z) = zone_of(instance).or_else(|| t.zone.clone()) {
        labels.insert("topology.kubernetes.io/zone".into(), z);
    }
    if let Some(m) = &t.gpu_model {
        labels.insert("nvidia.com/gpu.product".into(), m.clone());
        labels.insert("nvidia.com/gpu.present".into(), "true".into());
    }
    let mut resources = json!({
        "cpu": format!("{}m", t.allocatable.cpu_milli),
        "memory": t.allocatable.memory_bytes.to_string(),
        "pods": "110",
    });
    // As the NVIDIA device plugin advertises them: whole GPUs, time-sliced replicas (with the
    // replica count label GFD sets), or MIG instances per profile (mixed strategy).
    let mut mig: BTreeMap<String, u32> = BTreeMap::new();
    let mut whole = 0u32;
    for d in &t.gpus {
        match &d.mode {
            GpuMode::Standard => whole += 1,
            GpuMode::TimeSliced { replicas } => {
                whole += replicas;
                labels.insert("nvidia.com/gpu.replicas".into(), replicas.to_string());
                labels.insert("nvidia.com/gpu.count".into(), t.gpus.len().to_string());
            }
            GpuMode::Mig { instances, .. } => {
                labels.insert("nvidia.com/mig.strategy".into(), "mixed".into());
                for i in instances {
                    *mig.entry(format!("nvidia.com/mig-{}", i.placement.profile)).or_default() += 1;
                }
            }
        }
    }
    if whole > 0 {
        resources["nvidia.com/gpu"] = json!(whole.to_string());
    }
    for (k, n) in mig {
        resources[k] = json!(n.to_string());
    }
    let taints: Vec<Value> = t
        .taints
        .iter()
        .map(|x| json!({"key": x.key, "value": x.value, "effect": format!("{:?}", x.effect)}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name(instance), "labels": labels},
        "spec": {"providerID": instance, "taints": taints},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
        }
    })
}

/// A pod fixture: `gpus` whole GPUs, 1 CPU, owned by `owner_kind` (`ReplicaSet`, `Job`, or
/// `None` for a bare pod), optionally bound to `node` (then Running and Ready).
pub fn pod_json(ns: &str, name: &str, gpus: u32, owner_kind: Option<&str>, node: Option<&str>) -> Value {
    let mut requests = json!({"cpu": "1", "memory": "1Gi"});
    if gpus > 0 {
        requests["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": if gpus > 0 { json!({"nvidia.com/gpu": gpus.to_string()}) } else { json!({}) }}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1
        },
        "status": {"phase": "Pending"}
    });
    if let Some(kind) = owner_kind {
        let api = if kind == "Job" { "batch/v1" } else { "apps/v1" };
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": api, "kind": kind, "name": format!("{name}-owner"), "uid": format!("uid-{name}"), "controller": true}]);
    }
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
        p["status"] = json!({
            "phase": "Running",
            "startTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}]
        });
    }
    p
}

/// Starts a controller replica on `client` acting on `cloud`, with Lease identity `identity`; its
/// Events and status ConfigMaps go out too, as in `gpuscale run`.
pub fn spawn_replica(
    client: kube::Client,
    cloud: Arc<SimulatedCloud>,
    identity: &str,
    config: ControllerConfig,
    planner: PlannerSettings,
    dry_run: bool,
) -> Replica {
    spawn_mutant(client, cloud, identity, config, planner, dry_run, Default::default())
}

/// [`spawn_replica`] with one of the gate's rules broken on purpose (the safety suite's mutants).
pub fn spawn_mutant(
    client: kube::Client,
    cloud: Arc<SimulatedCloud>,
    identity: &str,
    config: ControllerConfig,
    planner: PlannerSettings,
    dry_run: bool,
    mutant: gpuscale::controller::gate::Mutant,
) -> Replica {
    let providers = Arc::new(ProviderSet::from_simulated(vec![cloud]));
    spawn_on(client, providers, identity, config, planner, dry_run, mutant)
}

/// [`spawn_mutant`] on any accounts (a real provider against an emulator).
pub fn spawn_on(
    client: kube::Client,
    providers: Arc<ProviderSet>,
    identity: &str,
    config: ControllerConfig,
    planner: PlannerSettings,
    dry_run: bool,
    mutant: gpuscale::controller::gate::Mutant,
) -> Replica {
    let recorder = Arc::new(Recorder::default());
    let options = ControllerOptions {
        config,
        planner,
        identity: identity.to_string(),
        namespace: LEASE_NAMESPACE.to_string(),
        dry_run,
        drive_simulated_clock: false,
        mutant,
    };
    let (status, _status_task) =
        gpuscale::controller::status::StatusPublisher::new(client.clone(), LEASE_NAMESPACE, identity).spawn();
    let observers: Vec<Arc<dyn gpuscale::controller::Observer>> = vec![
        recorder.clone(),
        Arc::new(gpuscale::controller::observers::StatusObserver::new(status.clone())),
    ];
    let controller =
        Controller::new(client, providers, options, Arc::new(gpuscale::controller::Observers(observers)));
    status.set_fence(controller.fence());
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(controller.run(stop_rx));
    Replica { task, stop, recorder }
}

impl Replica {
    /// Stops the replica cleanly (releasing its Lease) and returns what its loop returned.
    pub async fn shutdown(self) -> Result<(), ControllerError> {
        self.stop.send_replace(true);
        self.task.await.expect("the controller task panicked")
    }
}

/// A running controller replica.
pub struct Replica {
    /// The controller task; aborting it is a crash.
    pub task: JoinHandle<Result<(), ControllerError>>,
    /// Set to true for a clean shutdown.
    pub stop: watch::Sender<bool>,
    /// What it reported.
    pub recorder: Arc<Recorder>,
}

/// One simulated account, one group of 4-GPU L4 nodes.
pub fn l4_providers(target: u32, max: u32) -> String {
    l4_group(target, 0, max)
}

/// [`l4_providers`] with a minimum size.
pub fn l4_group(target: u32, min: u32, max: u32) -> String {
    format!(
        r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {{bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}}
    nodeGroups:
      - name: gpu-l4
        instanceType: g6.12xlarge
        zones: [us-east-1a]
        minSize: {min}
        maxSize: {max}
        targetSize: {target}
"#
    )
}

/// Tenancy of two teams of one cohort (namespaces `team-a`, `team-b`), 4 GPUs each guaranteed,
/// a team borrowing what the other leaves; preemption on.
pub const TWO_TEAMS: &str = r#"
cohorts: [{name: ml}]
tenants:
  - {name: team-a, cohort: ml, match: {namespaces: [team-a]}, quotas: {nvidia.com/gpu: {nominal: 4}}}
  - {name: team-b, cohort: ml, match: {namespaces: [team-b]}, quotas: {nvidia.com/gpu: {nominal: 4}}}
preemption: {enabled: true}
"#;

/// Controller settings with test-sized windows.
pub fn fast_config() -> ControllerConfig {
    let d = ControllerConfig::default();
    ControllerConfig {
        batch_idle_seconds: 0.2,
        batch_max_seconds: 1.0,
        resync_seconds: 0.3,
        scale_down_unneeded_seconds: 0.5,
        drain_grace_cap_seconds: 5.0,
        drain_timeout_seconds: 120.0,
        training: gpuscale::controller::config::TrainingProtection { min_runtime_seconds: 0.0, ..d.training },
        registration_timeout_seconds: 60.0,
        gang_timeout_seconds: 30.0,
        lease: gpuscale::controller::config::LeaseConfig {
            duration_seconds: 2,
            renew_seconds: 0.3,
            renew_deadline_seconds: 1.4,
            ..d.lease
        },
        ..d
    }
}

/// Records the observer calls as lines.
#[derive(Default)]
pub struct Recorder {
    /// `kind: details` per call.
    pub lines: Mutex<Vec<String>>,
    /// The last plan and whether it was a dry run.
    pub last_plan: Mutex<Option<(Plan, bool)>>,
}

impl Recorder {
    /// Lines starting with `prefix`.
    pub fn with_prefix(&self, prefix: &str) -> Vec<String> {
        self.lines.lock().unwrap().iter().filter(|l| l.starts_with(prefix)).cloned().collect()
    }
    fn push(&self, s: String) {
        self.lines.lock().unwrap().push(s);
    }
}

impl Observer for Recorder {
    fn plan_computed(&self, plan: &Plan, _: &ClusterSnapshot, dry_run: bool, _: Duration) {
        *self.last_plan.lock().unwrap() = Some((plan.clone(), dry_run));
    }
    fn scaled_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
        self.push(format!("scaled_up: {group} {from}->{to} {}", pods.join(",")));
    }
    fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32) {
        self.push(format!("replacement_requested: {node} {group} {from}->{to}"));
    }
    fn scale_up_failed(&self, group: &str, error: &str) {
        self.push(format!("scale_up_failed: {group} {error}"));
    }
    fn drain_started(&self, node: &str, reason: &str) {
        self.push(format!("drain_started: {node} {reason}"));
    }
    fn node_deleted(&self, node: &str, group: &str) {
        self.push(format!("node_deleted: {node} {group}"));
    }
    fn eviction_blocked(&self, pod: &str, node: &str, reason: &str) {
        self.push(format!("eviction_blocked: {pod} {node} {reason}"));
    }
    fn backoff(&self, group: &str, reason: &str) {
        self.push(format!("backoff: {group} {reason}"));
    }
    fn preempted(&self, victim: &str, node: &str, preemptor: &str, reason: &str) {
        self.push(format!("preempted: {victim} {node} {preemptor} {reason}"));
    }
    fn drain_abandoned(&self, node: &str, group: &str, reason: &str) {
        self.push(format!("drain_abandoned: {node} {group} {reason}"));
    }
}
