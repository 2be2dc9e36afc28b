//! A cluster on the real control plane for end-to-end controller tests, the way kwok-based tests
//! of Cluster Autoscaler and Karpenter build one: a simulated cloud whose running instances
//! register Nodes (this harness plays kubelet: the Node appears with the `not-ready` taint, then
//! turns Ready after [`KubeCluster::ready_after`]), the real kube-scheduler binds pods, and the
//! harness marks bound pods Running, finishes pod deletions once their grace period is over,
//! removes pods of deleted nodes (the pod garbage collector) and keeps PodDisruptionBudget status
//! current (the disruption controller), since kube-controller-manager runs only the controllers a
//! test asks for (`Options::controllers`: resourceclaim, replicaset, garbage collector).
//!
//! Controller replicas run as ServiceAccounts bound to exactly the RBAC that `helm template`
//! renders for `charts/gpuscale`.
//!
//! Include after the control plane and the fixtures:
//! ```ignore
//! #[path = "support/controlplane.rs"]
//! mod controlplane;
//! #[path = "support/controller_fixtures.rs"]
//! mod fixtures;
//! #[path = "support/kube_cluster.rs"]
//! mod kube_cluster;
//! ```
#![allow(dead_code)]

use crate::controlplane::{AuditEvent, ControlPlane, Options};
pub use crate::fixtures::*;
use gpuscale::model::{InstanceState, NodeGroup};
use gpuscale::planner::PlannerSettings;
use gpuscale::providers::config::{self, ProviderConfig};
use gpuscale::providers::simulated::SimulatedCloud;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// The taint a registering node carries until it is Ready (the node lifecycle controller's).
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// The cluster.
pub struct KubeCluster {
    /// The control plane.
    pub cp: ControlPlane,
    /// The cloud.
    pub cloud: Arc<SimulatedCloud>,
    /// The provider config the cloud was built from.
    pub providers: ProviderConfig,
    /// Real time from registration to Ready.
    pub ready_after: Duration,
    /// Whether new instances register Nodes (off: kubelets that never come).
    pub register: AtomicBool,
    /// Instance id -> (node name, registration time, Ready yet).
    registered: Mutex<BTreeMap<String, (String, Instant, bool)>>,
    /// The chart's controller ClusterRole and Role names, once applied.
    chart_roles: Mutex<Option<(String, String)>>,
    /// Pods the pod garbage collector removed because their node was gone, other than DaemonSet
    /// and mirror pods: work destroyed without a drain (`namespace/name on node`).
    pub killed: Mutex<Vec<String>>,
    /// Whether the Nodes of terminated instances are deleted (the cloud node lifecycle
    /// controller's work; off: a cluster where it lags or is missing).
    pub collect_nodes: AtomicBool,
}

fn lp() -> ListParams {
    ListParams::default()
}

/// The helm binary `scripts/test.sh` installs, or a panic saying how to get one.
fn helm() -> PathBuf {
    if let Some(h) = std::env::var_os("GPUSCALE_HELM") {
        return PathBuf::from(h);
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tools/helm-4.1.4/helm");
    assert!(local.is_file(), "no helm: run `export GPUSCALE_HELM=\"$(charts/scripts/install-helm.sh)\"`");
    local
}

/// The controller's ClusterRole and Role as `helm template` renders them for `namespace`.
fn chart_rbac(namespace: &str) -> Vec<Value> {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/gpuscale");
    let out = std::process::Command::new(helm())
        .args(["template", "gpuscale"])
        .arg(&chart)
        .args(["--namespace", namespace])
        .output()
        .expect("running helm template");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut roles = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("helm output is YAML");
        let controller = v["metadata"]["labels"]["app.kubernetes.io/component"] == "controller";
        if controller && (v["kind"] == "ClusterRole" || v["kind"] == "Role") {
            roles.push(v);
        }
    }
    assert_eq!(roles.len(), 2, "the chart renders one controller ClusterRole and one Role");
    roles
}

impl KubeCluster {
    /// Starts the control plane and the simulated cloud of `provider_yaml` (one account).
    pub async fn start(provider_yaml: &str, options: Options) -> Arc<Self> {
        Self::start_with(provider_yaml, options, Duration::from_millis(300)).await
    }

    /// [`KubeCluster::start`] with nodes turning Ready `ready_after` their registration.
    pub async fn start_with(provider_yaml: &str, options: Options, ready_after: Duration) -> Arc<Self> {
        let providers = config::load_strs(&[("test-providers.yaml", provider_yaml)])
            .unwrap_or_else(|e| panic!("test provider config: {e}"));
        let cloud = SimulatedCloud::from_config(&providers).into_iter().next().expect("a simulated account");
        let cp = ControlPlane::start(options).await;
        cp.ensure_namespace("ml").await;
        cp.ensure_namespace(LEASE_NAMESPACE).await;
        Arc::new(Self {
            cp,
            cloud: Arc::new(cloud),
            providers,
            ready_after,
            register: AtomicBool::new(true),
            registered: Mutex::new(BTreeMap::new()),
            chart_roles: Mutex::new(None),
            killed: Mutex::new(Vec::new()),
            collect_nodes: AtomicBool::new(true),
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

    /// Live (pending or running) instance ids of group `name`.
    pub fn live_instances(&self, name: &str) -> Vec<String> {
        self.group(name)
            .instances
            .iter()
            .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
            .map(|i| i.id.clone())
            .collect()
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cp.admin.clone())
    }

    fn pods(&self) -> Api<Pod> {
        Api::all(self.cp.admin.clone())
    }

    /// Creates `obj` as the admin.
    pub async fn create(&self, obj: Value) -> Value {
        let path = crate::controlplane::object_path(&obj);
        let collection = path.rsplit_once('/').unwrap().0.to_string();
        self.cp.raw("POST", &collection, Some(obj)).await.unwrap_or_else(|e| panic!("create {path}: {e}"))
    }

    /// The instances each successful `delete_instances` call named, in order.
    pub fn deleted_instances(&self) -> Vec<Vec<String>> {
        self.cloud
            .operations()
            .into_iter()
            .filter_map(|r| match r.op {
                gpuscale::providers::simulated::Operation::DeleteInstances {
                    instances, error: None, ..
                } => Some(instances),
                _ => None,
            })
            .collect()
    }

    /// The group size changes the cloud carried out, as (from, to).
    pub fn set_target_calls(&self) -> Vec<(u32, u32)> {
        self.cloud
            .operations()
            .into_iter()
            .filter_map(|r| match r.op {
                gpuscale::providers::simulated::Operation::SetTargetSize {
                    from, to, error: None, ..
                } => Some((from, to)),
                _ => None,
            })
            .collect()
    }

    /// The node kube-scheduler bound `ml/<pod>` to, once it is Running.
    pub async fn running_on(&self, pod: &str) -> Option<String> {
        self.running_in("ml", pod).await
    }

    /// The node kube-scheduler bound `<ns>/<pod>` to, once it is Running.
    pub async fn running_in(&self, ns: &str, pod: &str) -> Option<String> {
        let p = self.get(&format!("/api/v1/namespaces/{ns}/pods/{pod}")).await?;
        (p["status"]["phase"] == "Running")
            .then(|| p["spec"]["nodeName"].as_str().unwrap_or_default().to_string())
    }

    /// The object at `path` (e.g. `/api/v1/namespaces/ml/pods/x`), if it exists.
    pub async fn get(&self, path: &str) -> Option<Value> {
        match self.cp.raw("GET", path, None).await {
            Ok(v) => Some(v),
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// Pod `ml/name`.
    pub async fn pod(&self, name: &str) -> Option<Value> {
        self.get(&format!("/api/v1/namespaces/ml/pods/{name}")).await
    }

    /// Node `name`.
    pub async fn node(&self, name: &str) -> Option<Value> {
        self.get(&format!("/api/v1/nodes/{name}")).await
    }

    /// Registers every running instance as a Ready node at once (an existing cluster).
    pub async fn register_all_ready(&self) -> Vec<String> {
        let mut names = Vec::new();
        for g in self.groups() {
            for i in g.instances.iter().filter(|i| i.state == InstanceState::Running) {
                let name = node_name(&i.id);
                self.register_node(&g, &i.id, true).await;
                self.registered.lock().unwrap().insert(i.id.clone(), (name.clone(), Instant::now(), true));
                names.push(name);
            }
        }
        names.sort();
        names
    }

    /// Creates the Node of `instance` as its kubelet would: NotReady with the not-ready taint
    /// (which the API server's admission adds anyway), or already Ready.
    async fn register_node(&self, group: &NodeGroup, instance: &str, ready: bool) {
        // A kubelet registers its Node with capacity and conditions in one create.
        let mut node = node_json(group, instance);
        let status = node["status"].clone();
        let now = Timestamp::now().to_string();
        node["status"]["conditions"] = json!([{
            "type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]);
        if !ready {
            node["spec"]["taints"]
                .as_array_mut()
                .unwrap()
                .push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
        }
        let name = node_name(instance);
        match self.nodes().create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("registering node {name}: {e}"),
        }
        self.set_node_status(&name, status, ready).await;
        // The TaintNodesByCondition admission plugin gives every new Node the not-ready taint;
        // the node lifecycle controller lifts it once the node is Ready.
        if ready {
            assert!(self.make_ready(&name).await, "node {name} could not be made Ready");
        }
    }

    async fn set_node_status(&self, name: &str, mut status: Value, ready: bool) {
        let now = Timestamp::now().to_string();
        status["conditions"] = json!([{
            "type": "Ready",
            "status": if ready { "True" } else { "False" },
            "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]);
        let patch = json!({"status": status});
        if let Err(e) = self.nodes().patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await
        {
            eprintln!("kubelet: status of node {name}: {e}");
        }
    }

    /// Marks node `name` Ready and lifts its not-ready taint.
    pub async fn make_ready(&self, name: &str) -> bool {
        let Ok(node) = self.nodes().get(name).await else { return false };
        let taints: Vec<Value> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != NOT_READY_TAINT)
            .map(|t| serde_json::to_value(t).unwrap())
            .collect();
        let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}, "spec": {"taints": taints}});
        if self.nodes().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_err() {
            return false; // a conflict with the controller's own write: again next step
        }
        let status = serde_json::to_value(node.status.unwrap_or_default()).unwrap();
        self.set_node_status(name, status, true).await;
        true
    }

    /// The kubelets, the node lifecycle, the pod garbage collector and the disruption controller,
    /// one pass.
    pub async fn kubelet_step(&self) -> Result<(), kube::Error> {
        // Running instances without a Node register one; registered nodes turn Ready in time.
        let groups = self.groups();
        let live: BTreeMap<String, NodeGroup> = groups
            .iter()
            .flat_map(|g| {
                g.instances
                    .iter()
                    .filter(|i| i.state == InstanceState::Running)
                    .map(move |i| (i.id.clone(), g.clone()))
            })
            .collect();
        if self.register.load(Ordering::Relaxed) {
            let new: Vec<(String, NodeGroup)> = {
                let reg = self.registered.lock().unwrap();
                live.iter()
                    .filter(|(id, _)| !reg.contains_key(*id))
                    .map(|(id, g)| (id.clone(), g.clone()))
                    .collect()
            };
            for (id, g) in new {
                self.register_node(&g, &id, false).await;
                self.registered.lock().unwrap().insert(id.clone(), (node_name(&id), Instant::now(), false));
            }
        }
        let due: Vec<(String, String)> = self
            .registered
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, (_, at, ready))| !ready && at.elapsed() >= self.ready_after)
            .map(|(id, (n, _, _))| (id.clone(), n.clone()))
            .collect();
        for (id, name) in due {
            if self.make_ready(&name).await {
                if let Some(e) = self.registered.lock().unwrap().get_mut(&id) {
                    e.2 = true;
                }
            }
        }
        // Terminated instances: their Nodes go (the cloud node lifecycle controller).
        let gone: Vec<(String, String)> = self
            .registered
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| !live.contains_key(*id))
            .map(|(id, (n, _, _))| (id.clone(), n.clone()))
            .collect();
        for (id, name) in gone.into_iter().filter(|_| self.collect_nodes.load(Ordering::SeqCst)) {
            match self.nodes().delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
            self.registered.lock().unwrap().remove(&id);
        }

        // Pods: bound ones start; deletions finish after their grace period; pods of nodes that
        // no longer exist are removed.
        let nodes: std::collections::BTreeSet<String> =
            self.nodes().list(&lp()).await?.items.into_iter().filter_map(|n| n.metadata.name).collect();
        let now = Timestamp::now();
        for pod in self.pods().list(&lp()).await?.items {
            let (ns, name) = (pod.metadata.namespace.clone().unwrap(), pod.metadata.name.clone().unwrap());
            let api: Api<Pod> = Api::namespaced(self.cp.admin.clone(), &ns);
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let orphan = node.as_ref().is_some_and(|n| !nodes.contains(n));
            let expired = pod.metadata.deletion_timestamp.as_ref().is_some_and(|t| t.0 <= now);
            if orphan || expired {
                let node_bound = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
                    || pod
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.kind == "DaemonSet" || o.kind == "Node");
                if orphan && !node_bound {
                    self.killed
                        .lock()
                        .unwrap()
                        .push(format!("{ns}/{name} on {}", node.clone().unwrap_or_default()));
                }
                match api.delete(&name, &DeleteParams::default().grace_period(0)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            if node.is_some() && phase == "Pending" && pod.metadata.deletion_timestamp.is_none() {
                let t = now.to_string();
                let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
                let patch = json!({"status": {
                    "phase": "Running",
                    "startTime": t,
                    "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
                }});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
        }
        self.disruption_step().await
    }

    /// PodDisruptionBudget status as the disruption controller computes it for integer
    /// `minAvailable`/`maxUnavailable` and `matchLabels` selectors: healthy pods are Running and
    /// Ready, not terminating and not already disrupted.
    async fn disruption_step(&self) -> Result<(), kube::Error> {
        let pdbs: Api<PodDisruptionBudget> = Api::all(self.cp.admin.clone());
        let pods = self.pods().list(&lp()).await?.items;
        for pdb in pdbs.list(&lp()).await?.items {
            let ns = pdb.metadata.namespace.clone().unwrap();
            let name = pdb.metadata.name.clone().unwrap();
            let spec = pdb.spec.clone().unwrap_or_default();
            let want = spec.selector.and_then(|s| s.match_labels).unwrap_or_default();
            let disrupted = pdb.status.as_ref().and_then(|s| s.disrupted_pods.clone()).unwrap_or_default();
            let matching: Vec<&Pod> = pods
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(&ns))
                .filter(|p| {
                    let l = p.metadata.labels.clone().unwrap_or_default();
                    want.iter().all(|(k, v)| l.get(k) == Some(v))
                })
                .collect();
            let healthy = matching
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| !disrupted.contains_key(p.metadata.name.as_deref().unwrap_or_default()))
                .filter(|p| {
                    p.status.as_ref().is_some_and(|s| {
                        s.phase.as_deref() == Some("Running")
                            && s.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
                    })
                })
                .count() as i32;
            let expected = matching.len() as i32;
            let int = |v: &Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>| match v {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i)) => Some(*i),
                _ => None,
            };
            let desired = match (int(&spec.min_available), int(&spec.max_unavailable)) {
                (Some(m), _) => m,
                (None, Some(u)) => (expected - u).max(0),
                _ => expected,
            };
            let patch = json!({"status": {
                "observedGeneration": pdb.metadata.generation,
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "expectedPods": expected,
                "disruptionsAllowed": (healthy - desired).max(0),
            }});
            pdbs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.ok();
            let _ = &ns;
        }
        Ok(())
    }

    /// Advances the cloud by `dt` of virtual time, then runs the kubelets.
    pub async fn step(&self, dt: Duration) {
        self.cloud.advance(dt);
        if let Err(e) = self.kubelet_step().await {
            // The API server may be restarting; the next step catches up.
            eprintln!("kubelet step: {e}");
        }
    }

    /// Steps every `tick` of real time, advancing the cloud by `tick * speedup`.
    pub fn spawn_driver(self: &Arc<Self>, tick: Duration, speedup: u32) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                me.step(tick * speedup).await;
            }
        })
    }

    /// Applies the chart's controller roles once and binds them to ServiceAccount
    /// `kube-system/gpuscale-<identity>`; returns that account's client.
    pub async fn controller_client(&self, identity: &str, with_rbac: bool) -> kube::Client {
        let sa = format!("gpuscale-{identity}");
        let (_, client) = self.cp.service_account(LEASE_NAMESPACE, &sa).await;
        if !with_rbac {
            return client;
        }
        let roles = self.chart_roles.lock().unwrap().clone();
        let (cluster_role, role) = match roles {
            Some(r) => r,
            None => {
                let mut names = (String::new(), String::new());
                for r in chart_rbac(LEASE_NAMESPACE) {
                    if r["kind"] == "ClusterRole" {
                        names.0 = r["metadata"]["name"].as_str().unwrap().to_string();
                    } else {
                        names.1 = r["metadata"]["name"].as_str().unwrap().to_string();
                    }
                    self.cp.apply(r).await;
                }
                *self.chart_roles.lock().unwrap() = Some(names.clone());
                names
            }
        };
        let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": LEASE_NAMESPACE}]);
        self.cp
            .apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("{cluster_role}-{identity}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
                "subjects": subject,
            }))
            .await;
        self.cp
            .apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": format!("{role}-{identity}"), "namespace": LEASE_NAMESPACE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": subject,
            }))
            .await;
        client
    }

    /// Starts a controller replica as ServiceAccount `gpuscale-<identity>` with the chart's RBAC.
    pub async fn controller(
        &self,
        identity: &str,
        config: ControllerConfig,
        planner: PlannerSettings,
        dry_run: bool,
    ) -> Replica {
        self.mutant_controller(identity, config, planner, dry_run, Default::default()).await
    }

    /// [`KubeCluster::controller`] with one of the gate's rules broken on purpose.
    pub async fn mutant_controller(
        &self,
        identity: &str,
        config: ControllerConfig,
        planner: PlannerSettings,
        dry_run: bool,
        mutant: gpuscale::controller::gate::Mutant,
    ) -> Replica {
        let client = self.controller_client(identity, true).await;
        spawn_mutant(client, self.cloud.clone(), identity, config, planner, dry_run, mutant)
    }

    /// Starts a controller replica like [`KubeCluster::controller`] whose API connection goes to
    /// `url` instead (a proxy in front of the API server that a test can cut).
    pub async fn controller_via(
        &self,
        url: &str,
        identity: &str,
        config: ControllerConfig,
        planner: PlannerSettings,
    ) -> Replica {
        self.controller_client(identity, true).await;
        let (path, _) = self.cp.service_account(LEASE_NAMESPACE, &format!("gpuscale-{identity}")).await;
        let text = std::fs::read_to_string(&path).unwrap().replace(&self.cp.url, url);
        let via = path.with_extension("via.kubeconfig");
        std::fs::write(&via, text).unwrap();
        let client = self.cp.client_from(&via, true).await;
        spawn_replica(client, self.cloud.clone(), identity, config, planner, false)
    }

    /// The audit user of replica `identity`.
    pub fn user(identity: &str) -> String {
        format!("system:serviceaccount:{LEASE_NAMESPACE}:gpuscale-{identity}")
    }

    /// The requests replica `identity` made, from the audit log.
    pub fn requests_of(&self, identity: &str) -> Vec<AuditEvent> {
        let user = Self::user(identity);
        self.cp.audit().into_iter().filter(|e| e.user == user).collect()
    }

    /// Panics unless every request replica `identity` made was allowed by the real authorizer
    /// (the chart's RBAC), and it made some; refusals while the API server was restarting and
    /// warming its RBAC caches are the server's, not the chart's.
    pub fn assert_rbac_allowed(&self, identity: &str) {
        let reqs = self.requests_of(identity);
        assert!(!reqs.is_empty(), "no requests of replica {identity} in the audit log");
        let denied: Vec<String> = reqs
            .iter()
            .filter(|e| e.code == 403 || e.decision == "forbid")
            .filter(|e| !self.cp.during_restart(e))
            .map(|e| format!("{} {} -> {}", e.verb, e.uri, e.code))
            .collect();
        assert!(denied.is_empty(), "the chart's RBAC refused replica {identity}:\n{}", denied.join("\n"));
    }

    /// Waits until `check` holds, polling every 100 ms; panics after `limit` saying `what`.
    pub async fn wait_until<F, Fut>(&self, limit: Duration, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let began = Instant::now();
        while !check().await {
            assert!(began.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
