//! A small cluster around the fake API server for controller tests: a simulated cloud whose
//! running instances register as Nodes (the harness plays kubelet: it creates each Node from its
//! group's template and marks it Ready after a delay), and a tiny scheduler that binds pending
//! pods to Ready nodes with gpuscale's own placer. The test drives the simulated cloud's clock.
//!
//! Include after the fake API server:
//! ```ignore
//! #[path = "support/apiserver/mod.rs"]
//! mod apiserver;
//! #[path = "support/cluster_harness.rs"]
//! mod harness;
//! ```
#![allow(dead_code)]

use crate::apiserver::{FakeApiServer, Settings};
pub use gpuscale::controller::config::ControllerConfig;
use gpuscale::controller::providers::ProviderSet;
use gpuscale::controller::reconcile::{Controller, ControllerError, ControllerOptions};
use gpuscale::controller::Observer;
use gpuscale::k8s::SourcedObject;
use gpuscale::model::{ClusterSnapshot, NodeGroup, NodeState};
use gpuscale::planner::{Plan, PlannerSettings};
use gpuscale::providers::config::{self, ProviderConfig};
use gpuscale::providers::simulated::SimulatedCloud;
use gpuscale::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};
use gpuscale::scheduler::Placer;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Namespace of the controller's Lease in the tests.
pub const LEASE_NAMESPACE: &str = "kube-system";

/// The fake cluster.
pub struct Cluster {
    /// The API server.
    pub server: FakeApiServer,
    /// The cloud.
    pub cloud: Arc<SimulatedCloud>,
    /// The provider config the cloud was built from.
    pub providers: ProviderConfig,
    /// Real time from registration to Ready.
    pub ready_after: Duration,
    /// Instance id -> (node name, registration time).
    registered: Mutex<BTreeMap<String, (String, Instant)>>,
    /// Whether the harness binds pending pods.
    pub schedule: std::sync::atomic::AtomicBool,
    /// Whether new instances register Nodes (off: kubelets that never come).
    pub register: std::sync::atomic::AtomicBool,
}

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
    let mut labels: BTreeMap<String, String> = t.labels.clone();
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
    if !t.gpus.is_empty() {
        resources["nvidia.com/gpu"] = json!(t.gpus.len().to_string());
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

fn with_type(mut v: Value, api_version: &str, kind: &str) -> Value {
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    v
}

impl Cluster {
    /// Starts the API server and the simulated cloud of `provider_yaml` (one simulated account).
    pub async fn start(provider_yaml: &str, settings: Settings) -> Arc<Self> {
        let providers = config::load_strs(&[("test-providers.yaml", provider_yaml)])
            .unwrap_or_else(|e| panic!("test provider config: {e}"));
        let cloud = SimulatedCloud::from_config(&providers).into_iter().next().expect("a simulated account");
        let server = FakeApiServer::start_with(settings).await;
        server.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}));
        Arc::new(Self {
            server,
            cloud: Arc::new(cloud),
            providers,
            ready_after: Duration::from_millis(300),
            registered: Mutex::new(BTreeMap::new()),
            schedule: std::sync::atomic::AtomicBool::new(true),
            register: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The cloud's groups now.
    pub fn groups(&self) -> Vec<NodeGroup> {
        self.cloud.snapshot()
    }

    /// The group by short name.
    pub fn group(&self, name: &str) -> NodeGroup {
        self.groups().into_iter().find(|g| g.name() == name).unwrap_or_else(|| panic!("no group {name}"))
    }

    /// Registers every running instance as a Ready node at once (an existing cluster).
    pub fn register_all_ready(&self) -> Vec<String> {
        let mut names = Vec::new();
        for g in self.groups() {
            for i in g.instances.iter().filter(|i| i.state == gpuscale::model::InstanceState::Running) {
                let name = node_name(&i.id);
                if self.server.get("nodes", "", &name).is_none() {
                    self.server.create(node_json(&g, &i.id));
                }
                self.server.set_node_ready(&name, true);
                self.registered.lock().unwrap().insert(i.id.clone(), (name.clone(), Instant::now()));
                names.push(name);
            }
        }
        names
    }

    /// The kubelets: running instances without a Node register one; registered nodes become
    /// Ready after [`Self::ready_after`].
    pub fn kubelet_step(&self) {
        let mut reg = self.registered.lock().unwrap();
        let register = self.register.load(std::sync::atomic::Ordering::Relaxed);
        for g in self.groups().into_iter().filter(|_| register) {
            for i in g.instances.iter().filter(|i| i.state == gpuscale::model::InstanceState::Running) {
                if !reg.contains_key(&i.id) {
                    self.server.create(node_json(&g, &i.id));
                    reg.insert(i.id.clone(), (node_name(&i.id), Instant::now()));
                }
            }
        }
        for (name, at) in reg.values() {
            if at.elapsed() >= self.ready_after {
                if let Some(n) = self.server.get("nodes", "", name) {
                    let ready = n["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
                    if !ready {
                        self.server.set_node_ready(name, true);
                    }
                }
            }
        }
    }

    /// The cluster as gpuscale's converter sees it.
    pub fn snapshot(&self) -> ClusterSnapshot {
        let mut objects = Vec::new();
        for n in self.server.list("nodes", None) {
            objects.push(SourcedObject::new("node", with_type(n, "v1", "Node")));
        }
        for p in self.server.list("pods", None) {
            objects.push(SourcedObject::new("pod", with_type(p, "v1", "Pod")));
        }
        gpuscale::k8s::convert(&objects).expect("converting the fake cluster").snapshot
    }

    /// The scheduler: binds each pending pod to a Ready, schedulable node it fits.
    pub fn scheduler_step(&self) {
        if !self.schedule.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let snap = self.snapshot();
        let target = TargetWorkload::from_workloads(&snap.workloads, 0.95);
        let policy = PolicyKind::Gpuscale.build(&ClusterScale::of(&snap.nodes), &target);
        let mut placer = Placer::new(snap.nodes.clone(), policy.as_ref(), 1);
        for w in &snap.workloads {
            if let Some(n) = &w.node_name {
                if let Some(i) = snap.nodes.iter().position(|x| &x.name == n) {
                    if let Some(d) = &w.devices {
                        placer.commit(w, &gpuscale::scheduler::Placement { node: i, devices: d.clone() });
                    }
                }
            }
        }
        for w in snap.pending() {
            let ok = |i: usize| snap.nodes[i].state == NodeState::Ready && !snap.nodes[i].unschedulable;
            let Ok(p) = placer.place_where(w, &ok) else { continue };
            let (ns, name) = w.id.split_once('/').expect("namespace/name");
            let node = snap.nodes[p.node].name.clone();
            self.server.update("pods", ns, name, |o| {
                o["spec"]["nodeName"] = json!(node);
            });
            self.server.set_pod_phase(ns, name, "Running");
            self.server.update("pods", ns, name, |o| {
                o["status"]["startTime"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
            });
        }
    }

    /// Advances the cloud by `dt` of virtual time, then runs the kubelets and the scheduler.
    pub fn step(&self, dt: Duration) {
        self.cloud.advance(dt);
        self.kubelet_step();
        self.scheduler_step();
    }

    /// Steps every `tick` of real time, advancing the cloud by `tick * speedup`.
    pub fn spawn_driver(self: &Arc<Self>, tick: Duration, speedup: u32) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                me.step(tick * speedup);
            }
        })
    }

    /// Starts a controller replica whose requests carry the replica header `replica` and whose
    /// Lease identity is `replica`. Returns its task, its stop switch and what it reported.
    pub fn controller(&self, replica: &str, config: ControllerConfig, planner: PlannerSettings) -> Replica {
        self.controller_with(replica, config, planner, false)
    }

    /// [`Self::controller`], optionally in dry-run mode.
    pub fn controller_with(
        &self,
        replica: &str,
        config: ControllerConfig,
        planner: PlannerSettings,
        dry_run: bool,
    ) -> Replica {
        let client = self.server.replica_client(replica);
        let providers = Arc::new(ProviderSet::from_simulated(vec![self.cloud.clone()]));
        let recorder = Arc::new(Recorder::default());
        let options = ControllerOptions {
            config,
            planner,
            identity: replica.to_string(),
            namespace: LEASE_NAMESPACE.to_string(),
            dry_run,
            drive_simulated_clock: false,
        };
        // Events and status ConfigMaps go out too, as in `gpuscale run`, so the request log shows
        // everything the controller's service account must be allowed to do.
        let (status, _status_task) =
            gpuscale::controller::status::StatusPublisher::new(client.clone(), LEASE_NAMESPACE, replica)
                .spawn();
        let observers: Vec<Arc<dyn gpuscale::controller::Observer>> =
            vec![recorder.clone(), Arc::new(gpuscale::controller::observers::StatusObserver::new(status))];
        let controller =
            Controller::new(client, providers, options, Arc::new(gpuscale::controller::Observers(observers)));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(controller.run(stop_rx));
        Replica { task, stop, recorder }
    }
}

/// Panics unless every request of the controller replicas was allowed by the RBAC rules the chart
/// grants (`controller::rbac`).
pub fn assert_requests_allowed_by_rbac(server: &FakeApiServer) {
    use gpuscale::controller::rbac::{controller_allows, request_attributes};
    let requests = server.requests();
    let mut checked = 0;
    for r in requests.iter().filter(|r| r.replica.is_some()) {
        let watch = r.query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
        let attrs = request_attributes(&r.method, &r.path, watch)
            .unwrap_or_else(|| panic!("unrecognised request {} {}", r.method, r.path));
        assert!(
            controller_allows(&attrs, LEASE_NAMESPACE),
            "{} {}?{} ({attrs:?}) is not allowed by the chart's RBAC",
            r.method,
            r.path,
            r.query
        );
        checked += 1;
    }
    assert!(checked > 0, "no controller requests recorded");
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
}
