//! An in-process fake of the Compute Engine v1 REST API, for exactly the calls the GCP provider
//! makes, with the real JSON shapes (camelCase, `kind`, `selfLink`s, int64 as strings,
//! `compute#operation` with PENDING/RUNNING/DONE and `error.errors[]`).
//!
//! It is stateful: `resize` adds managed instances in CREATING (or marks the newest ones
//! DELETING), and they become RUNNING (or disappear) when the zone operation is polled to DONE;
//! `deleteInstances` marks the named members DELETING and lowers `targetSize`. Faults can be
//! injected: HTTP errors with the legacy `error.errors[].reason` body, operations that finish
//! with an error code, and stockouts that leave new instances CREATING with `lastAttempt`
//! errors. Requests are validated strictly; a call the real API does not have (wrong path,
//! method, query parameter or body) is answered 404/400 and recorded as a violation.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

const API: &str = "https://www.googleapis.com/compute/v1";
const TIMESTAMP: &str = "2026-01-05T09:30:00.000-08:00";

/// A machine type the fake serves.
#[derive(Clone, Debug)]
pub struct MachineTypeSpec {
    /// Name, e.g. `a2-highgpu-8g`.
    pub name: String,
    /// vCPUs.
    pub guest_cpus: i64,
    /// Memory, MB.
    pub memory_mb: i64,
    /// Bundled accelerators (type, count).
    pub accelerators: Vec<(String, i64)>,
}

/// An instance template the fake serves.
#[derive(Clone, Debug, Default)]
pub struct TemplateSpec {
    /// Name.
    pub name: String,
    /// Machine type name.
    pub machine_type: String,
    /// Attached accelerators (type, count).
    pub guest_accelerators: Vec<(String, i64)>,
    /// Instance labels.
    pub labels: BTreeMap<String, String>,
    /// GKE `kube-labels` metadata value.
    pub kube_labels: Option<String>,
    /// Spot provisioning.
    pub spot: bool,
}

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// Raw body.
    pub body: String,
}

/// An HTTP error to answer the next matching request(s) with.
#[derive(Clone, Debug)]
pub struct Fault {
    /// Method to match.
    pub method: &'static str,
    /// The path must end with this.
    pub path_suffix: String,
    /// HTTP status.
    pub status: u16,
    /// `error.errors[0].reason`.
    pub reason: &'static str,
    /// Message.
    pub message: String,
    /// `Retry-After` header, seconds.
    pub retry_after: Option<u64>,
    /// How many requests to fail.
    pub times: u32,
}

#[derive(Clone, Debug)]
struct Inst {
    name: String,
    id: u64,
    action: &'static str,
    status: Option<&'static str>,
    errors: Vec<(String, String)>,
}

#[derive(Clone, Debug)]
struct Mig {
    name: String,
    zone: String,
    id: u64,
    template: String,
    description: Option<String>,
    target_size: i64,
    instances: Vec<Inst>,
    stockout: bool,
    fail_next_operation: Option<(String, String, i64, String)>,
}

#[derive(Clone, Debug)]
enum Effect {
    Resize { created: Vec<String> },
    Delete,
    Failed,
}

#[derive(Clone, Debug)]
struct Op {
    name: String,
    id: u64,
    zone: String,
    mig: String,
    op_type: &'static str,
    status: &'static str,
    polls_left: u32,
    effect: Effect,
    error: Option<(String, String, i64, String)>,
}

#[derive(Default)]
struct Inner {
    project: String,
    next_id: u64,
    machine_types: BTreeMap<(String, String), MachineTypeSpec>,
    templates: BTreeMap<String, TemplateSpec>,
    migs: BTreeMap<(String, String), Mig>,
    ops: BTreeMap<(String, String), Op>,
    faults: Vec<Fault>,
    requests: Vec<Recorded>,
    violations: Vec<String>,
    page_size: usize,
    polls_to_done: u32,
}

impl Inner {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        7_100_000_000_000_000_000 + self.next_id
    }
}

/// A running fake Compute server on 127.0.0.1.
pub struct FakeCompute {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeCompute {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeCompute {
    /// Binds 127.0.0.1:0 and serves the fake API for `project`. Panics with a clear message if
    /// the socket cannot be bound.
    pub async fn start(project: &str) -> FakeCompute {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("fake Compute server: cannot bind a TCP socket on 127.0.0.1: {e}"));
        let addr = listener.local_addr().expect("fake Compute server: local address");
        let inner = Arc::new(Mutex::new(Inner {
            project: project.to_string(),
            page_size: 500,
            polls_to_done: 2,
            ..Inner::default()
        }));
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake Compute server stopped");
        });
        FakeCompute { addr, inner, server }
    }

    /// `http://127.0.0.1:<port>`, the endpoint override for the client.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().expect("fake state"))
    }

    /// Serves a machine type in a zone.
    pub fn add_machine_type(&self, zone: &str, spec: MachineTypeSpec) {
        self.with(|s| s.machine_types.insert((zone.to_string(), spec.name.clone()), spec));
    }

    /// Serves a global instance template.
    pub fn add_template(&self, spec: TemplateSpec) {
        self.with(|s| s.templates.insert(spec.name.clone(), spec));
    }

    /// Creates a MIG with `size` RUNNING instances.
    pub fn add_mig(&self, zone: &str, name: &str, template: &str, size: i64, description: Option<&str>) {
        self.with(|s| {
            let id = s.id();
            let mut mig = Mig {
                name: name.to_string(),
                zone: zone.to_string(),
                id,
                template: template.to_string(),
                description: description.map(str::to_string),
                target_size: size,
                instances: vec![],
                stockout: false,
                fail_next_operation: None,
            };
            for _ in 0..size {
                let inst = new_instance(s, &mig, "NONE", Some("RUNNING"));
                mig.instances.push(inst);
            }
            s.migs.insert((zone.to_string(), name.to_string()), mig);
        });
    }

    /// Injects an HTTP fault.
    pub fn inject(&self, fault: Fault) {
        self.with(|s| s.faults.push(fault));
    }

    /// The next operation on the MIG finishes DONE with this error code, its HTTP status and
    /// message, and changes nothing.
    pub fn fail_next_operation(&self, zone: &str, mig: &str, code: &str, http_status: i64, message: &str) {
        let http_message = match http_status {
            403 => "FORBIDDEN",
            429 => "TOO MANY REQUESTS",
            503 => "SERVICE UNAVAILABLE",
            _ => "BAD REQUEST",
        };
        self.with(|s| {
            s.migs
                .get_mut(&(zone.to_string(), mig.to_string()))
                .expect("fail_next_operation: no such MIG")
                .fail_next_operation =
                Some((code.to_string(), message.to_string(), http_status, http_message.to_string()))
        });
    }

    /// New instances of the MIG stay CREATING with a `ZONE_RESOURCE_POOL_EXHAUSTED` last attempt.
    pub fn set_stockout(&self, zone: &str, mig: &str, on: bool) {
        self.with(|s| {
            s.migs
                .get_mut(&(zone.to_string(), mig.to_string()))
                .expect("set_stockout: no such MIG")
                .stockout = on
        });
    }

    /// Items per page of list calls (never more than the client's `maxResults`).
    pub fn set_page_size(&self, n: usize) {
        self.with(|s| s.page_size = n.max(1));
    }

    /// How many polls (`get`/`wait`) an operation takes to reach DONE.
    pub fn set_polls_to_done(&self, n: u32) {
        self.with(|s| s.polls_to_done = n);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.with(|s| s.requests.clone())
    }

    /// Requests the real API would reject as malformed (wrong path, method, parameter, body).
    pub fn violations(&self) -> Vec<String> {
        self.with(|s| s.violations.clone())
    }

    /// Current `targetSize` of a MIG.
    pub fn target_size(&self, zone: &str, mig: &str) -> i64 {
        self.with(|s| s.migs[&(zone.to_string(), mig.to_string())].target_size)
    }

    /// (name, currentAction, instanceStatus) of each managed instance of a MIG.
    pub fn instances(&self, zone: &str, mig: &str) -> Vec<(String, String, Option<String>)> {
        self.with(|s| {
            s.migs[&(zone.to_string(), mig.to_string())]
                .instances
                .iter()
                .map(|i| (i.name.clone(), i.action.to_string(), i.status.map(str::to_string)))
                .collect()
        })
    }
}

fn new_instance(s: &mut Inner, mig: &Mig, action: &'static str, status: Option<&'static str>) -> Inst {
    let id = s.id();
    // Managed instance names are the base instance name plus a 4-character suffix.
    let suffix: String = format!("{:04x}", id % 0xffff);
    Inst { name: format!("{}-{suffix}", mig.name), id, action, status, errors: vec![] }
}

fn compute_error(status: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "error": {
            "code": status.as_u16(),
            "message": message,
            "errors": [{ "message": message, "domain": if status == StatusCode::TOO_MANY_REQUESTS { "usageLimits" } else { "global" }, "reason": reason }]
        }
    });
    (status, [(header::CONTENT_TYPE, "application/json; charset=UTF-8")], body.to_string()).into_response()
}

fn ok_json(v: Value) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json; charset=UTF-8")], v.to_string())
        .into_response()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// What a route accepts beyond the system parameters the client library always sends.
fn check_query(q: &BTreeMap<String, String>, allowed: &[&str]) -> Result<(), String> {
    for (k, v) in q {
        match k.as_str() {
            "$alt" if v == "json" => {}
            "$alt" => return Err(format!("$alt must be json, got {v:?}")),
            "$apiVersion" => {}
            other if allowed.contains(&other) => {}
            other => return Err(format!("unexpected query parameter {other}={v:?}")),
        }
    }
    Ok(())
}

fn zone_url(project: &str, zone: &str) -> String {
    format!("{API}/projects/{project}/zones/{zone}")
}

fn mig_json(project: &str, m: &Mig) -> Value {
    let zurl = zone_url(project, &m.zone);
    let count = |a: &str| m.instances.iter().filter(|i| i.action == a).count();
    let template_url = format!("{API}/projects/{project}/global/instanceTemplates/{}", m.template);
    let mut v = json!({
        "kind": "compute#instanceGroupManager",
        "id": m.id.to_string(),
        "creationTimestamp": TIMESTAMP,
        "name": m.name,
        "zone": zurl,
        "instanceTemplate": template_url,
        "versions": [{ "instanceTemplate": template_url, "targetSize": { "calculated": m.target_size } }],
        "instanceGroup": format!("{zurl}/instanceGroups/{}", m.name),
        "baseInstanceName": m.name,
        "fingerprint": "9V0v3bvPQ3s=",
        "currentActions": {
            "none": count("NONE"), "creating": count("CREATING"), "creatingWithoutRetries": 0,
            "verifying": 0, "recreating": 0, "deleting": count("DELETING"), "abandoning": 0,
            "restarting": 0, "refreshing": 0, "suspending": 0, "resuming": 0, "stopping": 0,
            "starting": 0
        },
        "status": {
            "isStable": m.instances.iter().all(|i| i.action == "NONE"),
            "versionTarget": { "isReached": true },
            "stateful": { "hasStatefulConfig": false, "perInstanceConfigs": { "allEffective": true } }
        },
        "targetSize": m.target_size,
        "listManagedInstancesResults": "PAGINATED",
        "selfLink": format!("{zurl}/instanceGroupManagers/{}", m.name),
        "updatePolicy": {
            "type": "OPPORTUNISTIC", "minimalAction": "REPLACE", "maxSurge": { "fixed": 1, "calculated": 1 },
            "maxUnavailable": { "fixed": 1, "calculated": 1 }, "replacementMethod": "SUBSTITUTE"
        },
        "instanceLifecyclePolicy": { "forceUpdateOnRepair": "NO", "defaultActionOnFailure": "REPAIR" }
    });
    if let Some(d) = &m.description {
        v["description"] = json!(d);
    }
    v
}

fn managed_instance_json(project: &str, m: &Mig, i: &Inst) -> Value {
    let mut v = json!({
        "instance": format!("{}/instances/{}", zone_url(project, &m.zone), i.name),
        "id": i.id.to_string(),
        "name": i.name,
        "currentAction": i.action,
        "version": { "instanceTemplate": format!("{API}/projects/{project}/global/instanceTemplates/{}", m.template) }
    });
    if let Some(st) = i.status {
        v["instanceStatus"] = json!(st);
    }
    if !i.errors.is_empty() {
        v["lastAttempt"] = json!({
            "errors": { "errors": i.errors.iter().map(|(c, msg)| json!({ "code": c, "message": msg })).collect::<Vec<_>>() }
        });
    }
    v
}

fn op_json(project: &str, op: &Op) -> Value {
    let zurl = zone_url(project, &op.zone);
    let mut v = json!({
        "kind": "compute#operation",
        "id": op.id.to_string(),
        "name": op.name,
        "zone": zurl,
        "operationType": op.op_type,
        "targetLink": format!("{zurl}/instanceGroupManagers/{}", op.mig),
        "targetId": "7100000000000000001",
        "status": op.status,
        "user": "gpuscale@fake-project.iam.gserviceaccount.com",
        "progress": if op.status == "DONE" { 100 } else { 0 },
        "insertTime": TIMESTAMP,
        "startTime": TIMESTAMP,
        "selfLink": format!("{zurl}/operations/{}", op.name)
    });
    if op.status == "DONE" {
        v["endTime"] = json!(TIMESTAMP);
        if let Some((code, message, http, http_message)) = &op.error {
            v["error"] = json!({ "errors": [{ "code": code, "message": message }] });
            v["httpErrorStatusCode"] = json!(http);
            v["httpErrorMessage"] = json!(http_message);
        }
    }
    v
}

fn machine_type_json(project: &str, zone: &str, m: &MachineTypeSpec) -> Value {
    let mut v = json!({
        "kind": "compute#machineType",
        "id": "1000000000000000001",
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "name": m.name,
        "description": format!("{} vCPUs, {} GB RAM", m.guest_cpus, m.memory_mb / 1024),
        "guestCpus": m.guest_cpus,
        "memoryMb": m.memory_mb,
        "imageSpaceGb": 0,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "zone": zone,
        "selfLink": format!("{}/machineTypes/{}", zone_url(project, zone), m.name),
        "isSharedCpu": false,
        "architecture": "X86_64"
    });
    if !m.accelerators.is_empty() {
        v["accelerators"] = json!(m
            .accelerators
            .iter()
            .map(|(t, n)| json!({ "guestAcceleratorType": t, "guestAcceleratorCount": n }))
            .collect::<Vec<_>>());
    }
    v
}

fn template_json(project: &str, t: &TemplateSpec) -> Value {
    let mut items = vec![json!({ "key": "startup-script", "value": "#!/bin/bash\necho ok" })];
    if let Some(k) = &t.kube_labels {
        items.push(json!({ "key": "kube-labels", "value": k }));
    }
    let mut props = json!({
        "machineType": t.machine_type,
        "canIpForward": false,
        "networkInterfaces": [{ "kind": "compute#networkInterface", "network": format!("{API}/projects/{project}/global/networks/default") }],
        "disks": [{
            "kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "boot": true, "autoDelete": true,
            "initializeParams": { "sourceImage": "projects/cos-cloud/global/images/family/cos-stable", "diskSizeGb": "100", "diskType": "pd-balanced" }
        }],
        "metadata": { "kind": "compute#metadata", "fingerprint": "nH1QKHJeBX0=", "items": items },
        "labels": t.labels,
        "scheduling": {
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": !t.spot,
            "preemptible": false,
            "provisioningModel": if t.spot { "SPOT" } else { "STANDARD" }
        },
        "serviceAccounts": [{ "email": "default", "scopes": ["https://www.googleapis.com/auth/cloud-platform"] }]
    });
    if !t.guest_accelerators.is_empty() {
        props["guestAccelerators"] = json!(t
            .guest_accelerators
            .iter()
            .map(|(a, n)| json!({ "acceleratorType": a, "acceleratorCount": n }))
            .collect::<Vec<_>>());
    }
    json!({
        "kind": "compute#instanceTemplate",
        "id": "4000000000000000001",
        "creationTimestamp": TIMESTAMP,
        "name": t.name,
        "description": "",
        "properties": props,
        "selfLink": format!("{API}/projects/{project}/global/instanceTemplates/{}", t.name)
    })
}

/// Pages `items` by `maxResults` (and the fake's page size) with an offset page token.
fn page<T: Clone>(
    items: &[T],
    q: &BTreeMap<String, String>,
    page_size: usize,
) -> Result<(Vec<T>, Option<String>), String> {
    let max = match q.get("maxResults") {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= 500)
            .ok_or_else(|| format!("maxResults must be an integer in [0, 500], got {v:?}"))?,
        None => 500,
    };
    let per_page = if max == 0 { 500 } else { max }.min(page_size);
    let start = match q.get("pageToken") {
        Some(t) => t
            .strip_prefix("fake-page-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= items.len())
            .ok_or_else(|| format!("invalid pageToken {t:?}"))?,
        None => 0,
    };
    let end = (start + per_page).min(items.len());
    let next = (end < items.len()).then(|| format!("fake-page-{end}"));
    Ok((items[start..end].to_vec(), next))
}

/// `name eq "<prefix>.*"` (the RE2 full-match filter syntax of Compute list calls), restricted to
/// the prefix form the provider uses.
fn name_filter(filter: &str) -> Result<String, String> {
    let rest = filter.strip_prefix("name eq ").ok_or_else(|| format!("unsupported filter {filter:?}"))?;
    let lit = rest
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| rest.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))
        .unwrap_or(rest);
    let prefix = lit.strip_suffix(".*").ok_or_else(|| format!("unsupported filter regex {lit:?}"))?;
    if prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        Ok(prefix.to_string())
    } else {
        Err(format!("unsupported filter regex {lit:?}"))
    }
}

fn violation(s: &mut Inner, status: StatusCode, what: String) -> Response {
    s.violations.push(what.clone());
    compute_error(status, if status == StatusCode::NOT_FOUND { "notFound" } else { "invalid" }, &what)
}

fn not_found(resource: &str) -> Response {
    compute_error(StatusCode::NOT_FOUND, "notFound", &format!("The resource '{resource}' was not found"))
}

fn empty_body_ok(body: &str) -> bool {
    let t = body.trim();
    t.is_empty() || t == "{}"
}

/// Advances an operation one poll; on reaching DONE applies its effect.
fn poll(s: &mut Inner, zone: &str, name: &str) -> Option<Value> {
    let project = s.project.clone();
    let key = (zone.to_string(), name.to_string());
    let op = s.ops.get_mut(&key)?;
    if op.status != "DONE" {
        op.polls_left = op.polls_left.saturating_sub(1);
        op.status = if op.polls_left == 0 { "DONE" } else { "RUNNING" };
        if op.status == "DONE" {
            let op = op.clone();
            if let Some(m) = s.migs.get_mut(&(op.zone.clone(), op.mig.clone())) {
                match &op.effect {
                    Effect::Resize { created } => {
                        for i in m.instances.iter_mut() {
                            if created.contains(&i.name) && !m.stockout {
                                i.action = "NONE";
                                i.status = Some("RUNNING");
                            }
                        }
                        m.instances.retain(|i| i.action != "DELETING");
                    }
                    Effect::Delete => m.instances.retain(|i| i.action != "DELETING"),
                    Effect::Failed => {}
                }
            }
        }
    }
    Some(op_json(&project, &s.ops[&key]))
}

fn start_op(s: &mut Inner, zone: &str, mig: &str, op_type: &'static str, effect: Effect) -> Value {
    let id = s.id();
    let error =
        s.migs.get_mut(&(zone.to_string(), mig.to_string())).and_then(|m| m.fail_next_operation.take());
    let name = format!("operation-1767634200000-{id:x}-fake");
    let op = Op {
        name: name.clone(),
        id,
        zone: zone.to_string(),
        mig: mig.to_string(),
        op_type,
        status: "PENDING",
        polls_left: s.polls_to_done.max(1),
        effect: if error.is_some() { Effect::Failed } else { effect },
        error,
    };
    let project = s.project.clone();
    let v = op_json(&project, &op);
    s.ops.insert((zone.to_string(), name), op);
    v
}

async fn handle(State(inner): State<Arc<Mutex<Inner>>>, method: Method, uri: Uri, body: Bytes) -> Response {
    let mut s = inner.lock().expect("fake state");
    let path = uri.path().to_string();
    let q = parse_query(uri.query());
    let body = String::from_utf8_lossy(&body).into_owned();
    s.requests.push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: q.clone(),
        body: body.clone(),
    });

    if let Some(pos) = s
        .faults
        .iter()
        .position(|f| f.method == method.as_str() && path.ends_with(&f.path_suffix) && f.times > 0)
    {
        let f = &mut s.faults[pos];
        f.times -= 1;
        let status = StatusCode::from_u16(f.status).expect("fault status");
        let mut resp = compute_error(status, f.reason, &f.message);
        if let Some(secs) = f.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        return resp;
    }

    let Some(rest) = path.strip_prefix("/compute/v1/projects/") else {
        return violation(&mut s, StatusCode::NOT_FOUND, format!("{method} {path}: not a Compute v1 path"));
    };
    let segs: Vec<&str> = rest.split('/').collect();
    if segs[0] != s.project {
        return not_found(&format!("projects/{}", segs[0]));
    }
    let project = s.project.clone();
    let m = method.as_str();
    match (m, &segs[1..]) {
        ("GET", ["zones", zone, "instanceGroupManagers"]) => {
            if let Err(e) =
                check_query(&q, &["filter", "maxResults", "pageToken", "orderBy", "returnPartialSuccess"])
            {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            let prefix = match q.get("filter").map(|f| name_filter(f)).transpose() {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}")),
            };
            let items: Vec<Value> = s
                .migs
                .values()
                .filter(|g| g.zone == *zone && g.name.starts_with(&prefix))
                .map(|g| mig_json(&project, g))
                .collect();
            let (items, next) = match page(&items, &q, s.page_size) {
                Ok(p) => p,
                Err(e) => return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}")),
            };
            let zurl = zone_url(&project, zone);
            let mut v = json!({
                "kind": "compute#instanceGroupManagerList",
                "id": format!("projects/{project}/zones/{zone}/instanceGroupManagers"),
                "items": items,
                "selfLink": format!("{zurl}/instanceGroupManagers"),
            });
            if let Some(n) = next {
                v["nextPageToken"] = json!(n);
            }
            ok_json(v)
        }
        ("GET", ["zones", zone, "instanceGroupManagers", name]) => {
            if let Err(e) = check_query(&q, &[]) {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            match s.migs.get(&(zone.to_string(), name.to_string())) {
                Some(g) => ok_json(mig_json(&project, g)),
                None => not_found(&format!("projects/{project}/zones/{zone}/instanceGroupManagers/{name}")),
            }
        }
        ("POST", ["zones", zone, "instanceGroupManagers", name, "listManagedInstances"]) => {
            if let Err(e) =
                check_query(&q, &["filter", "maxResults", "pageToken", "orderBy", "returnPartialSuccess"])
            {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            if !empty_body_ok(&body) {
                return violation(
                    &mut s,
                    StatusCode::BAD_REQUEST,
                    format!("{m} {path}: unexpected body {body:?}"),
                );
            }
            let Some(g) = s.migs.get(&(zone.to_string(), name.to_string())) else {
                return not_found(&format!("projects/{project}/zones/{zone}/instanceGroupManagers/{name}"));
            };
            let items: Vec<Value> =
                g.instances.iter().map(|i| managed_instance_json(&project, g, i)).collect();
            let (items, next) = match page(&items, &q, s.page_size) {
                Ok(p) => p,
                Err(e) => return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}")),
            };
            let mut v = json!({ "managedInstances": items });
            if let Some(n) = next {
                v["nextPageToken"] = json!(n);
            }
            ok_json(v)
        }
        ("POST", ["zones", zone, "instanceGroupManagers", name, "resize"]) => {
            if let Err(e) = check_query(&q, &["size", "requestId"]) {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            if !empty_body_ok(&body) {
                return violation(
                    &mut s,
                    StatusCode::BAD_REQUEST,
                    format!("{m} {path}: unexpected body {body:?}"),
                );
            }
            let Some(size) = q.get("size").and_then(|v| v.parse::<i64>().ok()).filter(|n| *n >= 0) else {
                return violation(
                    &mut s,
                    StatusCode::BAD_REQUEST,
                    format!("{m} {path}: query parameter size missing or invalid: {:?}", q.get("size")),
                );
            };
            let key = (zone.to_string(), name.to_string());
            let Some(mut g) = s.migs.get(&key).cloned() else {
                return not_found(&format!("projects/{project}/zones/{zone}/instanceGroupManagers/{name}"));
            };
            if g.fail_next_operation.is_some() {
                let v = start_op(&mut s, zone, name, "compute.instanceGroupManagers.resize", Effect::Failed);
                return ok_json(v);
            }
            let mut created = vec![];
            let live: Vec<usize> =
                (0..g.instances.len()).filter(|&i| g.instances[i].action != "DELETING").collect();
            if size as usize > live.len() {
                for _ in live.len()..size as usize {
                    let mut inst = new_instance(&mut s, &g, "CREATING", None);
                    if g.stockout {
                        inst.errors.push((
                            "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
                            format!("The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the request.  Try a different zone, or try again later."),
                        ));
                    }
                    created.push(inst.name.clone());
                    g.instances.push(inst);
                }
            } else {
                for &i in live.iter().rev().take(live.len() - size as usize) {
                    g.instances[i].action = "DELETING";
                }
            }
            g.target_size = size;
            s.migs.insert(key, g);
            let v = start_op(
                &mut s,
                zone,
                name,
                "compute.instanceGroupManagers.resize",
                Effect::Resize { created },
            );
            ok_json(v)
        }
        ("POST", ["zones", zone, "instanceGroupManagers", name, "deleteInstances"]) => {
            if let Err(e) = check_query(&q, &["requestId"]) {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            let parsed: Map<String, Value> = match serde_json::from_str(&body) {
                Ok(Value::Object(o)) => o,
                _ => {
                    return violation(
                        &mut s,
                        StatusCode::BAD_REQUEST,
                        format!("{m} {path}: body is not a JSON object: {body:?}"),
                    )
                }
            };
            if let Some(k) =
                parsed.keys().find(|k| !["instances", "skipInstancesOnValidationError"].contains(&k.as_str()))
            {
                return violation(
                    &mut s,
                    StatusCode::BAD_REQUEST,
                    format!("{m} {path}: unknown body field {k}"),
                );
            }
            let urls: Option<Vec<String>> = parsed
                .get("instances")
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|u| u.as_str().map(str::to_string)).collect());
            let Some(urls) = urls.filter(|u| !u.is_empty()) else {
                return violation(
                    &mut s,
                    StatusCode::BAD_REQUEST,
                    format!("{m} {path}: body.instances must be a non-empty string array: {body:?}"),
                );
            };
            let key = (zone.to_string(), name.to_string());
            let Some(mut g) = s.migs.get(&key).cloned() else {
                return not_found(&format!("projects/{project}/zones/{zone}/instanceGroupManagers/{name}"));
            };
            let mut victims = vec![];
            for u in &urls {
                let suffix = format!("projects/{project}/zones/{zone}/instances/");
                let inst = u.find(&suffix).map(|p| &u[p + suffix.len()..]);
                match inst.and_then(|n| g.instances.iter().position(|i| i.name == n)) {
                    Some(idx) => victims.push(idx),
                    None => {
                        return compute_error(
                            StatusCode::BAD_REQUEST,
                            "invalid",
                            &format!("Invalid value for field 'resource.instances[0]': '{u}'. The resource is not a member of the instance group."),
                        )
                    }
                }
            }
            if g.fail_next_operation.is_some() {
                let v = start_op(
                    &mut s,
                    zone,
                    name,
                    "compute.instanceGroupManagers.deleteInstances",
                    Effect::Failed,
                );
                return ok_json(v);
            }
            for idx in victims.iter().copied() {
                if g.instances[idx].action != "DELETING" {
                    g.instances[idx].action = "DELETING";
                    g.target_size -= 1;
                }
            }
            s.migs.insert(key, g);
            let v =
                start_op(&mut s, zone, name, "compute.instanceGroupManagers.deleteInstances", Effect::Delete);
            ok_json(v)
        }
        ("GET", ["zones", zone, "operations", op]) | ("POST", ["zones", zone, "operations", op, "wait"]) => {
            if let Err(e) = check_query(&q, &[]) {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            if m == "POST" && !empty_body_ok(&body) {
                return violation(
                    &mut s,
                    StatusCode::BAD_REQUEST,
                    format!("{m} {path}: unexpected body {body:?}"),
                );
            }
            match poll(&mut s, zone, op) {
                Some(v) => ok_json(v),
                None => not_found(&format!("projects/{project}/zones/{zone}/operations/{op}")),
            }
        }
        ("GET", ["zones", zone, "machineTypes", name]) => {
            if let Err(e) = check_query(&q, &[]) {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            match s.machine_types.get(&(zone.to_string(), name.to_string())) {
                Some(mt) => ok_json(machine_type_json(&project, zone, mt)),
                None => not_found(&format!("projects/{project}/zones/{zone}/machineTypes/{name}")),
            }
        }
        ("GET", ["global", "instanceTemplates", name]) => {
            if let Err(e) = check_query(&q, &[]) {
                return violation(&mut s, StatusCode::BAD_REQUEST, format!("{m} {path}: {e}"));
            }
            match s.templates.get(*name) {
                Some(t) => ok_json(template_json(&project, t)),
                None => not_found(&format!("projects/{project}/global/instanceTemplates/{name}")),
            }
        }
        _ => violation(&mut s, StatusCode::NOT_FOUND, format!("{m} {path}: no such Compute v1 method")),
    }
}
