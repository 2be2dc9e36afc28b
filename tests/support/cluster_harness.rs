//! A small cluster around the fake API server for controller tests: a simulated cloud whose
//! running instances register as Nodes (the harness plays kubelet: it creates each Node from its
//! group's template and marks it Ready after a delay), and a tiny scheduler that binds pending
//! pods to Ready nodes with gpuscale's own placer. The test drives the simulated cloud's clock.
//!
//! Include after the fake API server:
//! ```ignore
//! #[path = "support/apiserver/mod.rs"]
//! mod apiserver;
//! #[path = "support/controller_fixtures.rs"]
//! mod fixtures;
//! #[path = "support/cluster_harness.rs"]
//! mod harness;
//! ```
#![allow(dead_code)]

use crate::apiserver::{FakeApiServer, Settings};
pub use crate::fixtures::*;
use gpuscale::k8s::SourcedObject;
use gpuscale::model::{ClusterSnapshot, NodeGroup, NodeState};
use gpuscale::planner::PlannerSettings;
use gpuscale::providers::config::{self, ProviderConfig};
use gpuscale::providers::simulated::SimulatedCloud;
use gpuscale::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};
use gpuscale::scheduler::Placer;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

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
        // Events and status ConfigMaps go out too, so the request log shows everything the
        // controller's service account must be allowed to do.
        spawn_replica(
            self.server.replica_client(replica),
            self.cloud.clone(),
            replica,
            config,
            planner,
            dry_run,
        )
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
        // As the real authorizer judges it: a patch (server-side apply) that creates the object
        // must also be allowed to create it.
        if r.method == "PATCH" && r.status == 201 {
            let create = gpuscale::controller::rbac::RequestAttributes { verb: "create", ..attrs.clone() };
            assert!(
                controller_allows(&create, LEASE_NAMESPACE),
                "{} {} created the object, which the chart's RBAC does not allow (create)",
                r.method,
                r.path
            );
        }
        checked += 1;
    }
    assert!(checked > 0, "no controller requests recorded");
}
