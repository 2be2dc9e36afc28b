//! An in-process stand-in for the Kubernetes API server, for integration tests of the controller
//! over real HTTP with kube's real client, `watcher` and `reflector`.
//!
//! # Layout
//!
//! A module tree under `tests/support/apiserver/`, included by each test crate that needs it
//! with a path attribute (the same way `tests/support/fake_compute.rs` is used):
//!
//! ```ignore
//! #[path = "support/apiserver/mod.rs"]
//! mod apiserver;
//! use apiserver::{FakeApiServer, Fault, Settings};
//! ```
//!
//! Test crates using it need the `controller` feature (kube, k8s-openapi):
//! `[[test]] ... required-features = ["controller"]` in Cargo.toml.
//!
//! # Example
//!
//! ```ignore
//! let server = FakeApiServer::start().await;
//! server.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
//! server.set_node_ready("n1", true);
//! let nodes: kube::Api<Node> = kube::Api::all(server.client());
//! nodes.patch("n1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}}))).await?;
//! assert_eq!(server.get("node", "", "n1").unwrap()["spec"]["unschedulable"], true);
//! // Tell replicas apart in the request log:
//! let a = server.replica_client("a");
//! server.fail_next("PATCH", "/api/v1/nodes", 500, 1); // fault injection
//! assert!(server.requests().iter().any(|r| r.replica.as_deref() == Some("a")));
//! ```
//!
//! # The handle
//!
//! [`FakeApiServer::start`] / [`FakeApiServer::start_with`] ([`Settings`]), `url()`, `client()`
//! (no retries), `client_with_retries()` (kube's default retry, like `Client::try_default()`),
//! `replica_client(id)` / `client_with_header(..)`; fixtures that bypass HTTP: `create`,
//! `try_create`, `apply`, `get`, `list`, `update`, `delete`, `set_pod_phase`, `set_pod_ready`,
//! `set_node_ready`; faults: `fail_next`, `inject_fault(Fault::new(..).retry_after(..))`,
//! `pending_faults`; observation: `requests()` ([`RecordedRequest`]: method, path, query,
//! content type, replica header, status, body), `resource_version`, `active_watches`,
//! `expired_watches`, `wait_until`; watch control: `disconnect_watches`, `expire_history`;
//! `shutdown()` (or drop).
//!
//! # Real-server behaviours worth knowing (reproduced here)
//!
//! - kube's default client retries 429/503/504 up to 15 times and honours `Retry-After`; an
//!   eviction refused by a PDB answers 429 with `Retry-After: 10`, so with
//!   `Client::try_default()` a refused `evict` returns only after minutes of retries.
//! - kube 5 sends `EvictParams::delete_options` as a `delete_options` field the API server does
//!   not know: it is dropped (with a `Warning` header), so grace periods and preconditions set
//!   there have no effect. The pod's own grace period applies.
//! - Node `spec.taints` is an atomic list: a strategic merge patch carrying one taint replaces
//!   them all. Read, modify, and write back with the resourceVersion (409 on a race).
//! - More than one PDB matching a pod makes its eviction fail with 500.
//! - A PDB with maxUnavailable or a percentage needs the pods' controllers' scale (ReplicaSet,
//!   via its Deployment, StatefulSet, ReplicationController): pods without one (bare pods,
//!   Jobs, custom resources) leave it failing safe with no disruptions allowed (SyncFailed).
//!
//! # What it implements
//!
//! - Resources (see `resources.rs`): core/v1 namespaces, nodes, pods, configmaps, events,
//!   services, persistentvolumeclaims, persistentvolumes; storage.k8s.io/v1 storageclasses;
//!   policy/v1 poddisruptionbudgets; coordination.k8s.io/v1 leases; events.k8s.io/v1
//!   events; scheduling.x-k8s.io/v1alpha1 podgroups (as a custom resource). Cluster-scoped,
//!   namespaced and all-namespace paths; `/version`, `/api`, `/apis` and per-group discovery.
//! - One global resourceVersion; every write bumps it and becomes a watch event. Server-set
//!   uid, creationTimestamp, generation (bumped when anything outside metadata/status changes).
//! - list: label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, `>`, `<`), field
//!   selectors (`=`, `==`, `!=` over metadata.name/namespace and each resource's field labels,
//!   unsupported labels are a 400), `limit`/`continue` over a consistent snapshot,
//!   `remainingItemCount`. Built-in list items carry no kind/apiVersion (like the real
//!   server); custom resource items do.
//! - watch: history after `resourceVersion` then live, synthetic ADDED for `resourceVersion`
//!   unset/"0", `sendInitialEvents` with the initial-events-end bookmark, BOOKMARK events every
//!   `Settings::bookmark_interval`, `410` as an ERROR event with an `Expired` Status when the
//!   resourceVersion is older than the kept history (`Settings::history_len`,
//!   [`FakeApiServer::expire_history`]), `timeoutSeconds`, selectors with the watch cache's
//!   transitions (leaving the selection is DELETED, entering it ADDED).
//! - get, create (409 AlreadyExists, generateName, namespace must exist), replace (non-empty
//!   resourceVersion is a precondition: 409 Conflict), delete (preconditions,
//!   gracePeriodSeconds, finalizers; optional graceful pod deletion), deletecollection, patch
//!   (merge, JSON, strategic merge, server-side apply), `/status` for nodes, pods, PDBs,
//!   namespaces, services and podgroups; pods/binding (what a scheduler calls).
//! - core/v1 and events.k8s.io/v1 Events are one store seen through the real field conversion
//!   (regarding/involvedObject, note/message, reportingController/reportingComponent,
//!   deprecated* fields), so an event written through one API is visible through the other.
//! - Deleting a Node deletes its pods (pod garbage collection, `Settings::gc_pods_of_deleted_nodes`);
//!   deleting a Namespace deletes its contents.
//! - `dryRun=All` on every write: the real answer (errors included), nothing kept or watched.
//! - pods/eviction with the real checks and the 429 `TooManyRequests` refusal, and PDB status
//!   maintained like the disruption controller does, synchronously on every pod/PDB change.
//!
//! # Known limits (documented, deliberate)
//!
//! - Strategic merge: merge keys only for the lists in `patch::list_strategy`; `spec.taints`
//!   and `spec.tolerations` are atomic as in Kubernetes (a strategic patch with one taint
//!   replaces them all: read-modify-write with a resourceVersion instead).
//! - Server-side apply: create-or-merge with the same list semantics, and fields the same
//!   manager applied before and now omits are removed; no managedFields, no conflict detection
//!   between managers (`force` is accepted and has no effect).
//! - Workload controllers (apps/v1 ReplicaSets, Deployments, StatefulSets, core/v1
//!   ReplicationControllers) are stored and served but not run: no pods are created for them.
//!   They exist so PDB status can use their `spec.replicas`.
//! - No admission, no validation beyond names, namespaces, kinds, resourceVersions and the pod
//!   spec's immutability on update (images, activeDeadlineSeconds, added tolerations and removed
//!   scheduling gates only; fixtures written through the handle bypass it).
//! - `resourceVersionMatch=Exact` lists only serve the current resourceVersion.

// Each test crate uses a different part of the handle.
#![allow(dead_code, unused_imports)]

mod patch;
mod resources;
mod selectors;
mod server;
mod store;

pub use store::{ApiError, DeleteOptions, PatchType, Sub};

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use store::Store;

/// The header [`FakeApiServer::replica_client`] sets, recorded in [`RecordedRequest::replica`].
pub const REPLICA_HEADER: &str = "x-gpuscale-replica";

/// Server behaviour knobs. Build with struct update syntax:
/// `Settings { history_len: 5, ..Default::default() }`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Writes kept for watches to resume from; an older resourceVersion gets 410 Gone.
    pub history_len: usize,
    /// How often an idle watch with `allowWatchBookmarks` gets a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Pod deletion with a grace period sets deletionTimestamp and
    /// deletionGracePeriodSeconds, and the pod disappears when the grace period (capped by
    /// `max_grace_period`) ran out, as the kubelet would do. Off: pods go at once.
    pub graceful_pod_deletion: bool,
    /// Real-time cap on a pod's grace period in graceful mode, so tests stay fast.
    pub max_grace_period: Duration,
    /// Ends every watch after at most this long (the real server randomizes its timeouts);
    /// `None` honours `timeoutSeconds` (default 1800 s).
    pub watch_timeout_cap: Option<Duration>,
    /// `Retry-After` of the eviction 429 (10 s like the real server; 0 leaves it off). Note:
    /// kube's default client retries 429s and honours Retry-After.
    pub eviction_retry_after_seconds: u64,
    /// Namespaces that exist at start.
    pub namespaces: Vec<String>,
    /// Deleting a Node deletes the pods bound to it (the pod garbage collector's job; the real
    /// one waits ~40 s first).
    pub gc_pods_of_deleted_nodes: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            history_len: 10_000,
            bookmark_interval: Duration::from_secs(1),
            graceful_pod_deletion: false,
            max_grace_period: Duration::from_secs(2),
            watch_timeout_cap: None,
            eviction_retry_after_seconds: 10,
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .map(String::from)
                .to_vec(),
            gc_pods_of_deleted_nodes: true,
        }
    }
}

/// A fault: the next `times` requests whose method and path match answer `status` with a
/// Status object (reason from the code, e.g. 500 InternalError, 429 TooManyRequests).
#[derive(Clone, Debug)]
pub struct Fault {
    /// HTTP method, `None` for any.
    pub method: Option<String>,
    /// Path prefix (no query), e.g. `/api/v1/namespaces/default/pods/p1/eviction`.
    pub path_prefix: String,
    /// HTTP status to answer.
    pub status: u16,
    /// Remaining matching requests to fail.
    pub times: usize,
    /// Status message.
    pub message: String,
    /// `Retry-After` seconds, if any.
    pub retry_after: Option<u64>,
}

impl Fault {
    /// A fault for `method` (`"*"` for any) on paths starting with `path_prefix`.
    pub fn new(method: &str, path_prefix: &str, status: u16, times: usize) -> Self {
        Self {
            method: (method != "*").then(|| method.to_ascii_uppercase()),
            path_prefix: path_prefix.to_string(),
            status,
            times,
            message: format!("injected fault: {status}"),
            retry_after: None,
        }
    }

    /// With this Status message.
    pub fn message(mut self, message: &str) -> Self {
        self.message = message.to_string();
        self
    }

    /// With a `Retry-After` header.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.times > 0
            && self.method.as_deref().is_none_or(|m| m == method)
            && path.starts_with(&self.path_prefix)
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// Path without query.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Content-Type header.
    pub content_type: Option<String>,
    /// The [`REPLICA_HEADER`] value.
    pub replica: Option<String>,
    /// Response status (200 for a watch that started streaming).
    pub status: u16,
    /// Request body (lossy UTF-8).
    pub body: String,
}

impl RecordedRequest {
    /// A watch request.
    pub fn is_watch(&self) -> bool {
        form_urlencoded::parse(self.query.as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
    }

    /// A query parameter.
    pub fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
    }
}

/// State shared by the handle and the HTTP handlers.
pub(crate) struct Shared {
    store: Mutex<Store>,
    addr: SocketAddr,
    runtime: tokio::runtime::Handle,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the store under the lock, then starts the timers of any graceful deletion it
    /// scheduled.
    pub(crate) fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut Store, Timestamp) -> R) -> R {
        let (out, scheduled) = {
            let mut s = self.lock();
            let out = f(&mut s, Timestamp::now());
            (out, std::mem::take(&mut s.scheduled))
        };
        if !scheduled.is_empty() {
            self.start_timers(scheduled);
        }
        out
    }

    /// Not generic, so `with` does not instantiate itself recursively.
    fn start_timers(self: &Arc<Self>, scheduled: Vec<store::Scheduled>) {
        for d in scheduled {
            let shared = self.clone();
            self.runtime.spawn(async move {
                tokio::time::sleep(d.after).await;
                shared.with(|s, now| s.finish_graceful(&d, now));
            });
        }
    }
}

/// The running fake API server. Dropping it (or [`FakeApiServer::shutdown`]) ends open watches,
/// stops accepting connections and closes idle ones; requests still arriving on an open
/// connection are answered 503.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

fn resource(kind: &str) -> usize {
    resources::lookup(kind).unwrap_or_else(|| panic!("fake apiserver: unknown kind {kind:?}"))
}

impl FakeApiServer {
    /// Starts a server with default [`Settings`] on 127.0.0.1 and a free port.
    pub async fn start() -> Self {
        Self::start_with(Settings::default()).await
    }

    /// Starts a server with these settings.
    pub async fn start_with(settings: Settings) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("fake apiserver: cannot bind 127.0.0.1:0: {e}"));
        let addr = listener.local_addr().expect("fake apiserver: local address");
        let (tx, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(settings, tx)),
            addr,
            runtime: tokio::runtime::Handle::current(),
        });
        let app = axum::Router::new().fallback(server::handle).with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                eprintln!("fake apiserver on {addr} stopped: {e}");
            }
        });
        Self { shared, task: Some(task), stop: Some(stop) }
    }

    /// Stops the server and waits (up to 10 s) until its listener is closed.
    pub async fn shutdown(mut self) {
        self.signal_stop();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    fn signal_stop(&mut self) {
        self.with(|s, _| {
            s.closed = true;
            s.notify.send_replace(s.rv);
        });
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// A kube client config for this server: default namespace `default`, no auth, and
    /// `default_retry` off so injected or eviction 429/503s reach the caller instead of being
    /// retried inside the client (kube retries those up to 15 times honouring Retry-After).
    pub fn config(&self) -> kube::Config {
        let mut c = kube::Config::new(self.url().parse().expect("fake apiserver url"));
        c.default_retry = false;
        c
    }

    /// A kube client for this server (see [`Self::config`]).
    pub fn client(&self) -> kube::Client {
        gpuscale::tls::install_crypto_provider();
        kube::Client::try_from(self.config()).expect("fake apiserver: building a kube client")
    }

    /// A client as `kube::Client::try_default()` builds it for the controller: kube's default
    /// retry of 429/503/504 on (up to 15 attempts with exponential backoff from 5 ms, or the
    /// server's Retry-After when longer). Use it to test what production sees, e.g. that a PDB
    /// refusal (429, Retry-After 10 s) is retried inside the client before the caller sees it.
    pub fn client_with_retries(&self) -> kube::Client {
        let mut c = self.config();
        c.default_retry = true;
        gpuscale::tls::install_crypto_provider();
        kube::Client::try_from(c).expect("fake apiserver: building a kube client")
    }

    /// A client that sends an extra header with every request.
    pub fn client_with_header(&self, name: &str, value: &str) -> kube::Client {
        let mut c = self.config();
        c.headers.push((
            name.parse().unwrap_or_else(|e| panic!("header name {name:?}: {e}")),
            value.parse().unwrap_or_else(|e| panic!("header value {value:?}: {e}")),
        ));
        gpuscale::tls::install_crypto_provider();
        kube::Client::try_from(c).expect("fake apiserver: building a kube client")
    }

    /// A client whose requests carry `x-gpuscale-replica: <replica>` (see
    /// [`RecordedRequest::replica`]).
    pub fn replica_client(&self, replica: &str) -> kube::Client {
        self.client_with_header(REPLICA_HEADER, replica)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Store, Timestamp) -> R) -> R {
        self.shared.with(f)
    }

    /// Creates an object directly (a fixture): the resource comes from apiVersion/kind, the
    /// namespace from metadata (default `default`, created if missing); status is kept as
    /// given. Panics with the API error on failure.
    pub fn create(&self, obj: Value) -> Value {
        self.try_create(obj).unwrap_or_else(|e| panic!("fake apiserver: create failed: {e}"))
    }

    /// [`Self::create`] returning the API error.
    pub fn try_create(&self, obj: Value) -> Result<Value, ApiError> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let res = resources::by_type(api_version, kind).ok_or_else(|| {
            ApiError::bad_request(format!("no resource for apiVersion {api_version:?} kind {kind:?}"))
        })?;
        self.with(|s, now| s.create(res, None, obj, false, now))
    }

    /// Creates the object or merges it (RFC 7386, status included) over the stored one.
    pub fn apply(&self, obj: Value) -> Value {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let res = resources::by_type(&api_version, &kind)
            .unwrap_or_else(|| panic!("fake apiserver: no resource for {api_version} {kind}"));
        let rk = &resources::RESOURCES[res];
        let ns = if rk.namespaced { obj["metadata"]["namespace"].as_str().unwrap_or("default") } else { "" };
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if self.get(rk.plural, ns, &name).is_none() {
            return self.create(obj);
        }
        let ns = ns.to_string();
        self.update(&format!("{api_version}/{kind}"), &ns, &name, |o| {
            let mut patch = obj.clone();
            if let Some(m) = patch["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            patch::merge_patch(o, &patch);
        })
    }

    /// The stored object (`ns` "" for cluster-scoped kinds). Kinds are forgiving: `Pod`,
    /// `pods`, `po`, `pdb`, `policy/v1/PodDisruptionBudget`, `leases.coordination.k8s.io`,
    /// `events.k8s.io` (plain `Event` is core/v1).
    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let res = resource(kind);
        self.with(|s, _| s.get(res, ns, name))
    }

    /// Stored objects of a kind, in one namespace or (`None`) all, ordered by namespace/name.
    pub fn list(&self, kind: &str, ns: Option<&str>) -> Vec<Value> {
        let res = resource(kind);
        self.with(|s, _| s.all(res, ns))
    }

    /// Changes a stored object in place (fixture write, status included); the write bumps
    /// the resourceVersion and is seen by watches. Panics if it does not exist.
    pub fn update(&self, kind: &str, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Value {
        let res = resource(kind);
        self.with(|s, now| {
            let mut o =
                s.get(res, ns, name).unwrap_or_else(|| panic!("fake apiserver: no {kind} {ns}/{name}"));
            if let Some(m) = o["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            f(&mut o);
            s.update(res, ns, name, o, Sub::All, now).unwrap_or_else(|e| panic!("fake apiserver: {e}"))
        })
    }

    /// Deletes an object like an API DELETE without options. Returns the object and whether
    /// it is gone (false while finalizers or a graceful pod deletion hold it).
    pub fn delete(&self, kind: &str, ns: &str, name: &str) -> Result<(Value, bool), ApiError> {
        let res = resource(kind);
        self.with(|s, now| s.delete(res, ns, name, &DeleteOptions::default(), now))
    }

    /// Sets a pod's phase; `Running` also makes it Ready (conditions Ready and ContainersReady
    /// True), any other phase makes it not Ready.
    pub fn set_pod_phase(&self, ns: &str, name: &str, phase: &str) -> Value {
        self.update("pods", ns, name, |p| {
            p["status"]["phase"] = json!(phase);
            set_conditions(p, &["Ready", "ContainersReady"], phase == "Running");
        })
    }

    /// Sets a pod's Ready and ContainersReady conditions.
    pub fn set_pod_ready(&self, ns: &str, name: &str, ready: bool) -> Value {
        self.update("pods", ns, name, |p| set_conditions(p, &["Ready", "ContainersReady"], ready))
    }

    /// Sets a node's Ready condition.
    pub fn set_node_ready(&self, name: &str, ready: bool) -> Value {
        self.update("nodes", "", name, |n| set_conditions(n, &["Ready"], ready))
    }

    /// Adds a fault (see [`Fault`]).
    pub fn inject_fault(&self, fault: Fault) {
        self.with(|s, _| s.faults.push(fault));
    }

    /// The next `times` requests with `method` (`"*"` any) on paths starting with
    /// `path_prefix` answer `status`.
    pub fn fail_next(&self, method: &str, path_prefix: &str, status: u16, times: usize) {
        self.inject_fault(Fault::new(method, path_prefix, status, times));
    }

    /// Faults not yet used up.
    pub fn pending_faults(&self) -> Vec<Fault> {
        self.with(|s, _| s.faults.clone())
    }

    /// Every request so far, in arrival order (watches when they started streaming).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.with(|s, _| s.requests.clone())
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.with(|s, _| s.requests.clear());
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.with(|s, _| s.rv)
    }

    /// Open watch streams.
    pub fn active_watches(&self) -> usize {
        self.with(|s, _| s.active_watches)
    }

    /// Watches answered 410 Gone so far.
    pub fn expired_watches(&self) -> usize {
        self.with(|s, _| s.expired_watches)
    }

    /// Ends every open watch (clients see the stream close and re-watch).
    pub fn disconnect_watches(&self) {
        self.with(|s, _| {
            s.watch_epoch += 1;
            s.notify.send_replace(s.rv);
        });
    }

    /// Forgets the watch history and ends every open watch, so any re-watch from a
    /// resourceVersion issued so far gets 410 Gone and must re-list (an API server restart
    /// with a fresh watch cache, or etcd compaction).
    pub fn expire_history(&self) {
        self.with(|s, _| {
            s.compact();
            s.watch_epoch += 1;
        });
    }

    /// Polls `check` every 20 ms until it holds; panics naming `what` after `timeout`.
    pub async fn wait_until(&self, timeout: Duration, what: &str, check: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        while !check(self) {
            if tokio::time::Instant::now() >= deadline {
                panic!("fake apiserver: timed out after {timeout:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn set_conditions(obj: &mut Value, types: &[&str], on: bool) {
    let now = store::ts(Timestamp::now());
    if !obj["status"]["conditions"].is_array() {
        obj["status"]["conditions"] = json!([]);
    }
    let conds = obj["status"]["conditions"].as_array_mut().expect("conditions");
    let status = if on { "True" } else { "False" };
    for t in types {
        match conds.iter_mut().find(|c| c["type"] == *t) {
            Some(c) => {
                if c["status"] != status {
                    c["status"] = json!(status);
                    c["lastTransitionTime"] = json!(now);
                }
            }
            None => conds.push(json!({"type": t, "status": status, "lastTransitionTime": now})),
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.signal_stop();
    }
}
