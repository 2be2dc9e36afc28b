//! The in-memory object store: one global resourceVersion counter, a bounded event history for
//! watches, the generic write semantics (create, update, status subresource, patch, delete with
//! preconditions, finalizers and graceful pod deletion), and the two controllers a real cluster
//! runs that our controller depends on: the disruption controller (PDB status) and the eviction
//! subresource.

use super::patch;
use super::resources::{self as r, ResourceKind, RESOURCES};
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::{Fault, RecordedRequest, Settings};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// An API error, answered as a `Status` object with this code and reason, which kube's client
/// turns into `kube::Error::Api`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `Conflict`, `TooManyRequests`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details` (null when none).
    pub details: Value,
    /// `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with a code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self { code, reason: reason.into(), message: message.into(), details: Value::Null, retry_after: None }
    }

    /// An error for a status code with the reason the real server uses for it.
    pub fn from_code(code: u16, message: impl Into<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        Self::new(code, reason, message)
    }

    fn with_details(mut self, res: &ResourceKind, name: &str) -> Self {
        let mut d = json!({"name": name, "kind": res.plural});
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        self.details = d;
        self
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(res: &ResourceKind, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{}\" not found", res.group_resource(), name))
            .with_details(res, name)
    }

    /// 409 AlreadyExists.
    pub fn already_exists(res: &ResourceKind, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{}\" already exists", res.group_resource(), name))
            .with_details(res, name)
    }

    /// 409 Conflict, e.g. a stale resourceVersion.
    pub fn conflict(res: &ResourceKind, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{}\": {}", res.group_resource(), name, why),
        )
        .with_details(res, name)
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 Invalid.
    pub fn invalid(res: &ResourceKind, name: &str, why: &str) -> Self {
        Self::new(422, "Invalid", format!("{} \"{}\" is invalid: {}", res.kind, name, why))
            .with_details(res, name)
    }

    /// 410 Expired (too old resourceVersion or continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !self.details.is_null() {
            s["details"] = self.details.clone();
        }
        if let Some(ra) = self.retry_after {
            if !s["details"].is_object() {
                s["details"] = json!({});
            }
            s["details"]["retryAfterSeconds"] = json!(ra);
        }
        s
    }
}

/// The watch event types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One write in the history.
#[derive(Clone, Debug)]
pub struct HistEvent {
    /// The resourceVersion this write produced.
    pub rv: u64,
    /// Resource id.
    pub res: usize,
    /// Namespace ("" for cluster-scoped).
    pub ns: String,
    /// What happened.
    pub kind: EventType,
    /// The object before (for selector transitions).
    pub old: Option<Value>,
    /// The object after (for DELETED: the last state, with the deletion's resourceVersion).
    pub obj: Value,
}

/// Which part of an object a write targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    /// The main resource: status is kept when the resource has a status subresource.
    Main,
    /// `/status`: only status changes.
    Status,
    /// Test fixtures: the main resource and its status in one write.
    All,
}

/// Delete options (query parameters or a `DeleteOptions` body).
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

impl DeleteOptions {
    /// From a `DeleteOptions` JSON body (missing fields stay unset).
    pub fn from_body(v: &Value) -> Self {
        Self {
            grace_period_seconds: v.get("gracePeriodSeconds").and_then(Value::as_i64),
            uid: v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_string),
            resource_version: v
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }
}

/// The patch content types kube sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml`.
    Apply,
}

impl PatchType {
    /// From a Content-Type header value.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// A page of a list.
#[derive(Clone, Debug)]
pub struct ListPage {
    /// Items, as the wire shows them.
    pub items: Vec<Value>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// Continue token for the next page.
    pub continue_token: Option<String>,
    /// Items after this page (only without selectors, like the real server).
    pub remaining: Option<usize>,
}

/// A graceful pod deletion whose grace period runs out after `after`.
#[derive(Clone, Debug)]
pub struct Scheduled {
    /// Resource id.
    pub res: usize,
    /// Namespace.
    pub ns: String,
    /// Name.
    pub name: String,
    /// The uid, so a recreated object of the same name is left alone.
    pub uid: String,
    /// Real time until the pod disappears.
    pub after: Duration,
}

#[derive(Clone)]
struct Snapshot {
    rv: u64,
    items: Vec<Value>,
    selectors_empty: bool,
}

/// The whole server state.
pub struct Store {
    /// Settings given at start.
    pub settings: Settings,
    /// The global resourceVersion: the last write's.
    pub rv: u64,
    objects: Vec<BTreeMap<(String, String), Value>>,
    /// Recent writes for watches, oldest first.
    pub history: VecDeque<HistEvent>,
    /// A watch may resume from resourceVersion N only when N >= compacted.
    pub compacted: u64,
    uid_seq: u64,
    name_seq: u64,
    continues: BTreeMap<u64, Snapshot>,
    continue_seq: u64,
    applied: HashMap<(usize, String, String, String), Value>,
    /// Pending fault injections.
    pub faults: Vec<Fault>,
    /// The request log.
    pub requests: Vec<RecordedRequest>,
    /// Bumped to end every open watch.
    pub watch_epoch: u64,
    /// Open watch streams.
    pub active_watches: usize,
    /// Watches answered 410 Gone so far.
    pub expired_watches: usize,
    /// The server is shut down: watches end.
    pub closed: bool,
    /// Graceful deletions to time, drained by the server handle.
    pub scheduled: Vec<Scheduled>,
    /// Wakes watches after every write.
    pub notify: tokio::sync::watch::Sender<u64>,
}

/// Where a resource's objects live: events.k8s.io/v1 events are core/v1 events seen through a
/// conversion, as on the real server.
fn storage(res: usize) -> usize {
    if res == r::EVENTS_V1 {
        r::EVENTS
    } else {
        res
    }
}

/// events.k8s.io/v1 field name <-> core/v1 field name.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename_fields(obj: Value, to_core: bool, api_version: &str) -> Value {
    let Value::Object(m) = obj else { return obj };
    let mut out = Map::new();
    for (k, v) in m {
        let renamed = EVENT_FIELDS
            .iter()
            .find(|(v1, core)| if to_core { v1 == &k } else { core == &k })
            .map(|(v1, core)| if to_core { core.to_string() } else { v1.to_string() });
        out.insert(renamed.unwrap_or(k), v);
    }
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

/// An object as resource `res` serves it.
fn to_view(res: usize, obj: Value) -> Value {
    if res == r::EVENTS_V1 {
        rename_fields(obj, false, "events.k8s.io/v1")
    } else {
        obj
    }
}

/// An object of resource `res` in its storage form.
fn to_storage(res: usize, obj: Value) -> Value {
    if res == r::EVENTS_V1 {
        rename_fields(obj, true, "v1")
    } else {
        obj
    }
}

/// RFC 3339 at second precision, as metav1.Time serializes.
pub fn ts(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A create or update body must be an object of the resource's kind (when it names one).
fn check_body(rk: &ResourceKind, obj: &Value, verb: &str) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(format!("the body of a {} {verb} must be a JSON object", rk.kind)));
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != rk.kind => Err(ApiError::bad_request(format!(
            "the kind of the provided object ({k}) does not match the resource {}",
            rk.group_resource()
        ))),
        _ => Ok(()),
    }
}

fn meta_str<'a>(o: &'a Value, field: &str) -> Option<&'a str> {
    o.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str)
}

fn meta_mut(o: &mut Value) -> &mut Map<String, Value> {
    if !o["metadata"].is_object() {
        o["metadata"] = json!({});
    }
    o["metadata"].as_object_mut().expect("metadata object")
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// The pod update validation of the real server: the spec is immutable except container
/// images, activeDeadlineSeconds, added tolerations and removed scheduling gates (bind with
/// pods/binding to set spec.nodeName).
fn check_pod_update(old: &Value, new: &Value) -> Result<(), String> {
    let (Some(os), Some(ns)) = (old.get("spec"), new.get("spec")) else {
        return if old.get("spec") == new.get("spec") { Ok(()) } else { Err(POD_SPEC_FORBIDDEN.into()) };
    };
    let mut masked = ns.clone();
    for list in ["containers", "initContainers"] {
        let olds = os.get(list).and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(Value::Array(items)) = masked.get_mut(list) {
            if items.len() == olds.len() {
                for (n, o) in items.iter_mut().zip(&olds) {
                    n["image"] = o.get("image").cloned().unwrap_or(Value::Null);
                    if o.get("image").is_none() {
                        n.as_object_mut().expect("container").remove("image");
                    }
                }
            }
        }
    }
    let m = masked.as_object_mut().ok_or(POD_SPEC_FORBIDDEN)?;
    let old_tol = os.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    let new_tol = ns.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    if !old_tol.iter().all(|t| new_tol.contains(t)) {
        return Err(POD_SPEC_FORBIDDEN.into());
    }
    let old_gates = os.get("schedulingGates").and_then(Value::as_array).cloned().unwrap_or_default();
    let new_gates = ns.get("schedulingGates").and_then(Value::as_array).cloned().unwrap_or_default();
    if !new_gates.iter().all(|g| old_gates.contains(g)) {
        return Err("spec.schedulingGates: Forbidden: only deletion is allowed".into());
    }
    for k in ["tolerations", "activeDeadlineSeconds", "schedulingGates"] {
        match os.get(k) {
            Some(v) => m.insert(k.into(), v.clone()),
            None => m.remove(k),
        };
    }
    if masked == *os {
        Ok(())
    } else {
        Err(POD_SPEC_FORBIDDEN.into())
    }
}

const POD_SPEC_FORBIDDEN: &str = "spec: Forbidden: pod updates may not change fields other than \
     `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,\
     `spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` \
     (allow it to be set to 1 if it was previously negative)";

/// An IntOrString of a PDB against `total` pods, rounding up like the disruption controller.
fn scaled(v: &Value, total: i64) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64().ok_or_else(|| format!("invalid value {v}")),
        Value::String(s) => {
            let pct = s.strip_suffix('%').ok_or_else(|| format!("invalid value for IntOrString: {s:?}"))?;
            let pct: i64 = pct.parse().map_err(|_| format!("invalid value for IntOrString: {s:?}"))?;
            Ok((pct * total + 99) / 100)
        }
        _ => Err(format!("invalid value for IntOrString: {v}")),
    }
}

impl Store {
    /// A store holding the settings' initial namespaces.
    pub fn new(settings: Settings, notify: tokio::sync::watch::Sender<u64>) -> Self {
        let namespaces = settings.namespaces.clone();
        let mut s = Self {
            settings,
            rv: 0,
            objects: vec![BTreeMap::new(); RESOURCES.len()],
            history: VecDeque::new(),
            compacted: 0,
            uid_seq: 0,
            name_seq: 0,
            continues: BTreeMap::new(),
            continue_seq: 0,
            applied: HashMap::new(),
            faults: Vec::new(),
            requests: Vec::new(),
            watch_epoch: 0,
            active_watches: 0,
            expired_watches: 0,
            closed: false,
            scheduled: Vec::new(),
            notify,
        };
        let now = Timestamp::now();
        for ns in namespaces {
            s.create(r::NAMESPACES, None, json!({"metadata": {"name": ns}}), false, now)
                .expect("initial namespace");
        }
        s
    }

    /// A copy of the data for a dry run: writes to it are answered but not kept, watched or
    /// timed.
    pub fn scratch_copy(&self) -> Store {
        Store {
            settings: self.settings.clone(),
            rv: self.rv,
            objects: self.objects.clone(),
            history: VecDeque::new(),
            compacted: self.compacted,
            uid_seq: self.uid_seq,
            name_seq: self.name_seq,
            continues: BTreeMap::new(),
            continue_seq: self.continue_seq,
            applied: self.applied.clone(),
            faults: Vec::new(),
            requests: Vec::new(),
            watch_epoch: self.watch_epoch,
            active_watches: 0,
            expired_watches: 0,
            closed: false,
            scheduled: Vec::new(),
            notify: tokio::sync::watch::channel(self.rv).0,
        }
    }

    /// The stored object, as `res` serves it.
    pub fn get(&self, res: usize, ns: &str, name: &str) -> Option<Value> {
        self.objects[storage(res)].get(&(ns.to_string(), name.to_string())).map(|o| to_view(res, o.clone()))
    }

    /// All stored objects of a resource, in one namespace or all, in key order.
    pub fn all(&self, res: usize, ns: Option<&str>) -> Vec<Value> {
        self.objects[storage(res)]
            .iter()
            .filter(|((n, _), _)| ns.is_none_or(|x| x == n))
            .map(|(_, v)| to_view(res, v.clone()))
            .collect()
    }

    fn get_or_404(&self, res: usize, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.get(res, ns, name).ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))
    }

    /// Records a write: bumps the resourceVersion, stores or removes, appends to the history,
    /// wakes watches. Returns the object as stored.
    fn commit(&mut self, view: usize, kind: EventType, old: Option<Value>, obj: Value) -> Value {
        let res = storage(view);
        let old = old.map(|o| to_storage(view, o));
        let mut obj = to_storage(view, obj);
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let ns = meta_str(&obj, "namespace").unwrap_or_default().to_string();
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        if kind == EventType::Deleted {
            self.objects[res].remove(&(ns.clone(), name.clone()));
            self.applied.retain(|(r, n, m, _), _| !(storage(*r) == res && *n == ns && *m == name));
        } else {
            self.objects[res].insert((ns.clone(), name), obj.clone());
        }
        self.history.push_back(HistEvent { rv: self.rv, res, ns, kind, old, obj: obj.clone() });
        while self.history.len() > self.settings.history_len.max(1) {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
        self.notify.send_replace(self.rv);
        to_view(view, obj)
    }

    fn next_uid(&mut self) -> String {
        self.uid_seq += 1;
        format!("6b2f7e1a-0000-4000-8000-{:012x}", self.uid_seq)
    }

    fn generated_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.name_seq += 1;
        let mut x = self.name_seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5bd1_e995;
        (0..5)
            .map(|_| {
                let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
                x /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// Creates an object. `http` applies the API server's create semantics (namespace must
    /// exist, no resourceVersion, status reset for pods, PDBs and custom resources); fixtures
    /// (`http == false`) keep the status they are given and get their namespace created.
    pub fn create(
        &mut self,
        res: usize,
        path_ns: Option<&str>,
        mut obj: Value,
        http: bool,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let rk = &RESOURCES[res];
        check_body(rk, &obj, "create")?;
        if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
            if av != rk.api_version() {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({})",
                    rk.api_version()
                )));
            }
        }
        obj["kind"] = json!(rk.kind);
        obj["apiVersion"] = json!(rk.api_version());
        let body_ns = meta_str(&obj, "namespace").filter(|s| !s.is_empty()).map(str::to_string);
        let ns = if rk.namespaced {
            match (path_ns, body_ns) {
                (Some(p), Some(b)) if p != b => return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                )),
                (Some(p), _) => p.to_string(),
                (None, Some(b)) => b,
                (None, None) => "default".to_string(),
            }
        } else {
            String::new()
        };
        if rk.namespaced && self.get(r::NAMESPACES, "", &ns).is_none() {
            if http {
                return Err(ApiError::not_found(&RESOURCES[r::NAMESPACES], &ns));
            }
            self.create(r::NAMESPACES, None, json!({"metadata": {"name": ns}}), false, now)?;
        }
        if http && meta_str(&obj, "resourceVersion").is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::internal("resourceVersion should not be set on objects to be created"));
        }
        let mut name = meta_str(&obj, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").unwrap_or_default().to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    rk,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            loop {
                name = format!("{prefix}{}", self.generated_suffix());
                if self.get(res, &ns, &name).is_none() {
                    break;
                }
            }
        }
        if !is_dns_subdomain(&name) {
            return Err(ApiError::invalid(
                rk,
                &name,
                &format!(
                    "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case \
                     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        if self.get(res, &ns, &name).is_some() {
            return Err(ApiError::already_exists(rk, &name));
        }
        let uid = self.next_uid();
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            if rk.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(ts(now)));
            m.insert("generation".into(), json!(1));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("resourceVersion");
            m.remove("selfLink");
        }
        self.default_fields(res, &mut obj, http);
        let stored = self.commit(res, EventType::Added, None, obj);
        self.after_change(res, &ns, now);
        Ok(stored)
    }

    /// Server-side defaults and create-time status resets.
    fn default_fields(&self, res: usize, obj: &mut Value, http: bool) {
        match res {
            r::NAMESPACES => {
                if obj.pointer("/spec/finalizers").is_none() {
                    obj["spec"] = json!({"finalizers": ["kubernetes"]});
                }
                obj["status"] = json!({"phase": "Active"});
            }
            r::PODS => {
                if !obj["spec"].is_object() {
                    obj["spec"] = json!({});
                }
                let spec = obj["spec"].as_object_mut().expect("spec");
                spec.entry("restartPolicy").or_insert(json!("Always"));
                spec.entry("terminationGracePeriodSeconds").or_insert(json!(30));
                spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
                spec.entry("schedulerName").or_insert(json!("default-scheduler"));
                spec.entry("enableServiceLinks").or_insert(json!(true));
                if http || obj.get("status").is_none() {
                    obj["status"] = json!({"phase": "Pending"});
                }
            }
            r::PDBS => {
                if http {
                    if let Some(o) = obj.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            _ => {
                let rk = &RESOURCES[res];
                if http && rk.custom && rk.status_subresource {
                    if let Some(o) = obj.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
    }

    /// Replaces an object (PUT or the result of a patch), or its status. A non-empty
    /// `metadata.resourceVersion` in `new` is a precondition (409 when stale).
    pub fn update(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        new: Value,
        sub: Sub,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let rk = &RESOURCES[res];
        let old = self.get_or_404(res, ns, name)?;
        check_body(rk, &new, "update")?;
        if let Some(n) = meta_str(&new, "name") {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        if let Some(n) = meta_str(&new, "namespace").filter(|n| !n.is_empty()) {
            if rk.namespaced && n != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        if let Some(v) = meta_str(&new, "resourceVersion").filter(|v| !v.is_empty()) {
            if Some(v) != meta_str(&old, "resourceVersion") {
                return Err(ApiError::conflict(
                    rk,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
        }
        let mut result = match sub {
            Sub::Status => {
                let mut o = old.clone();
                match new.get("status") {
                    Some(s) => o["status"] = s.clone(),
                    None => {
                        o.as_object_mut().expect("object").remove("status");
                    }
                }
                o
            }
            Sub::Main | Sub::All => {
                let mut o = new;
                o["kind"] = old["kind"].clone();
                o["apiVersion"] = old["apiVersion"].clone();
                let keep = [
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "resourceVersion",
                ];
                let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
                let m = meta_mut(&mut o);
                for k in keep {
                    match old_meta.get(k) {
                        Some(v) => m.insert(k.into(), v.clone()),
                        None => m.remove(k),
                    };
                }
                if rk.status_subresource && sub == Sub::Main {
                    match old.get("status") {
                        Some(s) => o["status"] = s.clone(),
                        None => {
                            o.as_object_mut().expect("object").remove("status");
                        }
                    }
                }
                if res == r::PODS && sub == Sub::Main {
                    check_pod_update(&old, &o).map_err(|why| ApiError::invalid(rk, name, &why))?;
                }
                let strip = |v: &Value| {
                    let mut v = v.clone();
                    if let Some(m) = v.as_object_mut() {
                        m.remove("metadata");
                        m.remove("status");
                    }
                    v
                };
                if strip(&o) != strip(&old) {
                    let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
                    meta_mut(&mut o).insert("generation".into(), json!(g + 1));
                }
                o
            }
        };
        if result == old {
            return Ok(old);
        }
        let terminating = result.pointer("/metadata/deletionTimestamp").is_some();
        let no_finalizers =
            result.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(|f| f.is_empty());
        let grace_done =
            result.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0) == 0;
        if terminating && no_finalizers && grace_done {
            meta_mut(&mut result).remove("finalizers");
            let stored = self.commit(res, EventType::Deleted, Some(old), result);
            self.after_change(res, ns, now);
            return Ok(stored);
        }
        let stored = self.commit(res, EventType::Modified, Some(old), result);
        self.after_change(res, ns, now);
        Ok(stored)
    }

    /// Applies a patch of any supported type to the object or its status. Returns the stored
    /// object and whether it was created (server-side apply on a missing object).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: &[u8],
        sub: Sub,
        field_manager: Option<&str>,
        now: Timestamp,
    ) -> Result<(Value, bool), ApiError> {
        let rk = &RESOURCES[res];
        let decode = |b: &[u8]| -> Result<Value, ApiError> {
            serde_json::from_slice(b).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        match ptype {
            PatchType::Merge => {
                let p = decode(body)?;
                if !p.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                let mut o = self.get_or_404(res, ns, name)?;
                patch::merge_patch(&mut o, &p);
                Ok((self.update(res, ns, name, o, sub, now)?, false))
            }
            PatchType::Json => {
                let p: json_patch::Patch = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding json patch: {e}")))?;
                let mut o = self.get_or_404(res, ns, name)?;
                json_patch::patch(&mut o, &p)
                    .map_err(|e| ApiError::invalid(rk, name, &format!("json patch: {e}")))?;
                Ok((self.update(res, ns, name, o, sub, now)?, false))
            }
            PatchType::Strategic => {
                if rk.custom {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types include: \
                         application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                let p = decode(body)?;
                let mut o = self.get_or_404(res, ns, name)?;
                patch::strategic_merge(&mut o, &p).map_err(ApiError::bad_request)?;
                Ok((self.update(res, ns, name, o, sub, now)?, false))
            }
            PatchType::Apply => {
                let manager = field_manager.filter(|m| !m.is_empty()).ok_or_else(|| {
                    ApiError::bad_request("PATCH with apply patch type requires a fieldManager")
                })?;
                let cfg: Value = serde_yaml::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                if !cfg.is_object() {
                    return Err(ApiError::bad_request("an apply configuration must be an object"));
                }
                if cfg.get("apiVersion").and_then(Value::as_str) != Some(rk.api_version().as_str())
                    || cfg.get("kind").and_then(Value::as_str) != Some(rk.kind)
                {
                    return Err(ApiError::bad_request(format!(
                        "an apply configuration must set apiVersion {} and kind {}",
                        rk.api_version(),
                        rk.kind
                    )));
                }
                // Main resource and status are applied separately.
                let key = (res, ns.to_string(), name.to_string(), format!("{manager}/{sub:?}"));
                match self.get(res, ns, name) {
                    None => {
                        if sub == Sub::Status {
                            return Err(ApiError::not_found(rk, name));
                        }
                        let mut obj = cfg.clone();
                        meta_mut(&mut obj).insert("name".into(), json!(name));
                        let created = self.create(res, Some(ns).filter(|n| !n.is_empty()), obj, true, now)?;
                        self.applied.insert(key, cfg);
                        Ok((created, true))
                    }
                    Some(mut o) => {
                        if let Some(prev) = self.applied.get(&key) {
                            patch::remove_unapplied(&mut o, prev, &cfg, "");
                        }
                        patch::strategic_merge(&mut o, &cfg).map_err(ApiError::bad_request)?;
                        let stored = self.update(res, ns, name, o, sub, now)?;
                        self.applied.insert(key, cfg);
                        Ok((stored, false))
                    }
                }
            }
        }
    }

    /// Deletes an object. Returns the object and whether it is gone (false: it is terminating,
    /// waiting for finalizers or a pod's grace period).
    pub fn delete(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
        now: Timestamp,
    ) -> Result<(Value, bool), ApiError> {
        let rk = &RESOURCES[res];
        let obj = self.get_or_404(res, ns, name)?;
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        if let Some(p) = &opts.uid {
            if *p != uid {
                return Err(ApiError::conflict(
                    rk,
                    name,
                    &format!("Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"),
                ));
            }
        }
        if let Some(p) = &opts.resource_version {
            let cur = meta_str(&obj, "resourceVersion").unwrap_or_default();
            if p != cur {
                return Err(ApiError::conflict(
                    rk,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {cur}"
                    ),
                ));
            }
        }
        if res == r::PODS && self.settings.graceful_pod_deletion {
            let spec_grace =
                obj.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(30);
            let mut grace = opts.grace_period_seconds.unwrap_or(spec_grace).max(0);
            let unscheduled =
                obj.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default().is_empty();
            let phase = obj.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
            if unscheduled || phase == "Succeeded" || phase == "Failed" {
                grace = 0;
            }
            let current = obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64);
            if grace > 0 {
                if current.is_some_and(|c| c <= grace) {
                    return Ok((obj, false));
                }
                let mut o = obj.clone();
                let m = meta_mut(&mut o);
                m.insert(
                    "deletionTimestamp".into(),
                    json!(ts(Timestamp::from_second(now.as_second() + grace).unwrap_or(now))),
                );
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                let stored = self.commit(res, EventType::Modified, Some(obj), o);
                self.scheduled.push(Scheduled {
                    res,
                    ns: ns.to_string(),
                    name: name.to_string(),
                    uid,
                    after: Duration::from_secs(grace as u64).min(self.settings.max_grace_period),
                });
                self.after_change(res, ns, now);
                return Ok((stored, false));
            }
        }
        self.finish_delete(res, ns, obj, now)
    }

    /// Deletion once no grace period is left: waits for finalizers, else removes.
    fn finish_delete(
        &mut self,
        res: usize,
        ns: &str,
        obj: Value,
        now: Timestamp,
    ) -> Result<(Value, bool), ApiError> {
        let has_finalizers =
            obj.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if has_finalizers {
            let mut o = obj.clone();
            let m = meta_mut(&mut o);
            if !m.contains_key("deletionTimestamp") {
                m.insert("deletionTimestamp".into(), json!(ts(now)));
            }
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if o == obj {
                return Ok((obj, false));
            }
            let stored = self.commit(res, EventType::Modified, Some(obj), o);
            self.after_change(res, ns, now);
            return Ok((stored, false));
        }
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        let stored = self.commit(res, EventType::Deleted, Some(obj.clone()), obj);
        if res == r::NAMESPACES {
            for (other, rk) in RESOURCES.iter().enumerate() {
                if !rk.namespaced {
                    continue;
                }
                for o in self.all(other, Some(&name)) {
                    self.commit(other, EventType::Deleted, Some(o.clone()), o);
                }
            }
        }
        self.after_change(res, ns, now);
        if res == r::NODES && self.settings.gc_pods_of_deleted_nodes {
            // The pod garbage collector removes the pods bound to a node that is gone.
            let orphans: Vec<Value> = self
                .all(r::PODS, None)
                .into_iter()
                .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(name.as_str()))
                .collect();
            for p in orphans {
                let pns = meta_str(&p, "namespace").unwrap_or_default().to_string();
                self.finish_delete(r::PODS, &pns, p, now)?;
            }
        }
        Ok((stored, true))
    }

    /// The end of a pod's grace period (what the kubelet does): remove it unless finalizers hold it.
    pub fn finish_graceful(&mut self, s: &Scheduled, now: Timestamp) {
        let Some(obj) = self.get(s.res, &s.ns, &s.name) else { return };
        if meta_str(&obj, "uid") != Some(s.uid.as_str())
            || obj.pointer("/metadata/deletionTimestamp").is_none()
        {
            return;
        }
        let _ = self.finish_delete(s.res, &s.ns, obj, now);
    }

    /// Lists with selectors and paging (`limit` / `continue`), from a snapshot taken at the
    /// first page so the pages are consistent, like an etcd list at one revision.
    pub fn list(
        &mut self,
        res: usize,
        ns: Option<&str>,
        sel: &Selectors,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<ListPage, ApiError> {
        let (id, offset, snap_rv, items, selectors_empty) = match continue_token.filter(|c| !c.is_empty()) {
            Some(tok) => {
                let parsed = tok.split_once('.').and_then(|(a, b)| {
                    Some((u64::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
                });
                let Some((id, offset)) = parsed else {
                    return Err(ApiError::bad_request(format!("continue key is not valid: {tok:?}")));
                };
                let Some(s) = self.continues.get(&id) else {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can \
                         start a new list without the continue parameter.",
                    ));
                };
                (id, offset, s.rv, s.items.clone(), s.selectors_empty)
            }
            None => {
                let items: Vec<Value> = self.all(res, ns).into_iter().filter(|o| sel.matches(o)).collect();
                self.continue_seq += 1;
                (self.continue_seq, 0, self.rv, items, sel.is_empty())
            }
        };
        let end = limit.filter(|l| *l > 0).map_or(items.len(), |l| (offset + l).min(items.len()));
        let page: Vec<Value> = items[offset.min(items.len())..end].to_vec();
        let (continue_token, remaining) = if end < items.len() {
            if continue_token.is_none() {
                self.continues.insert(id, Snapshot { rv: snap_rv, items: items.clone(), selectors_empty });
                while self.continues.len() > 256 {
                    let first = *self.continues.keys().next().expect("non-empty");
                    self.continues.remove(&first);
                }
            }
            (Some(format!("{id:x}.{end:x}")), selectors_empty.then_some(items.len() - end))
        } else {
            self.continues.remove(&id);
            (None, None)
        };
        let custom = RESOURCES[res].custom;
        let items = page
            .into_iter()
            .map(|mut o| {
                if !custom {
                    // The real server leaves kind/apiVersion off the items of built-in lists.
                    if let Some(m) = o.as_object_mut() {
                        m.remove("kind");
                        m.remove("apiVersion");
                    }
                }
                o
            })
            .collect();
        Ok(ListPage { items, rv: snap_rv, continue_token, remaining })
    }

    /// Runs after every write to pods or PDBs: the disruption controller's view.
    fn after_change(&mut self, res: usize, ns: &str, now: Timestamp) {
        if matches!(
            res,
            r::PODS | r::PDBS | r::REPLICASETS | r::DEPLOYMENTS | r::STATEFULSETS | r::REPLICATIONCONTROLLERS
        ) {
            self.recompute_pdbs(ns, now);
        }
    }

    /// Recomputes the status of every PDB in a namespace as the disruption controller does:
    /// expectedPods (matching pods), currentHealthy (Ready, not terminating, not recently
    /// evicted), desiredHealthy (from minAvailable / maxUnavailable, int or percent, rounded up),
    /// disruptionsAllowed, observedGeneration and the DisruptionAllowed condition.
    pub fn recompute_pdbs(&mut self, ns: &str, now: Timestamp) {
        let pods = self.all(r::PODS, Some(ns));
        for pdb in self.all(r::PDBS, Some(ns)) {
            let sel = LabelSelector::from_object(pdb.pointer("/spec/selector").unwrap_or(&Value::Null))
                .ok()
                .flatten();
            let matching: Vec<&Value> =
                pods.iter().filter(|p| sel.as_ref().is_some_and(|s| s.matches(p))).collect();
            let old_status = pdb.get("status").cloned().unwrap_or(json!({}));
            // Evicted pods stay out of currentHealthy until they are terminating or gone, or
            // two minutes passed (the controller's DeletionTimeout).
            let mut disrupted = Map::new();
            if let Some(d) = old_status.get("disruptedPods").and_then(Value::as_object) {
                for (pod, at) in d {
                    let alive = matching.iter().any(|p| {
                        meta_str(p, "name") == Some(pod.as_str())
                            && p.pointer("/metadata/deletionTimestamp").is_none()
                    });
                    let fresh = at
                        .as_str()
                        .and_then(|s| s.parse::<Timestamp>().ok())
                        .is_some_and(|t| now.as_second() - t.as_second() < 120);
                    if alive && fresh {
                        disrupted.insert(pod.clone(), at.clone());
                    }
                }
            }
            // Integer minAvailable counts the matching pods; maxUnavailable and percentages
            // need the scale of the pods' controllers, and fail safe (no disruptions, status
            // not observed) when a pod has none the disruption controller can scale.
            let needs_scale = pdb.pointer("/spec/maxUnavailable").is_some()
                || pdb.pointer("/spec/minAvailable").is_some_and(Value::is_string);
            let expected = if needs_scale {
                match self.expected_scale(ns, &matching) {
                    Ok(n) => n,
                    Err(why) => {
                        self.fail_safe(pdb, &old_status, &why, now);
                        continue;
                    }
                }
            } else {
                matching.len() as i64
            };
            let healthy = matching
                .iter()
                .filter(|p| {
                    p.pointer("/metadata/deletionTimestamp").is_none()
                        && pod_ready(p)
                        && !disrupted.contains_key(meta_str(p, "name").unwrap_or_default())
                })
                .count() as i64;
            let desired = if let Some(mu) = pdb.pointer("/spec/maxUnavailable") {
                (expected - scaled(mu, expected).unwrap_or(0)).max(0)
            } else if let Some(ma) = pdb.pointer("/spec/minAvailable") {
                scaled(ma, expected).unwrap_or(0)
            } else {
                0
            };
            let allowed = (healthy - desired).max(0);
            let generation = pdb.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
            let (cond_status, reason) =
                if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
            let old_cond = old_status
                .get("conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"))
                .cloned();
            let transition = match &old_cond {
                Some(c) if c["status"] == cond_status => c["lastTransitionTime"].clone(),
                _ => json!(ts(now)),
            };
            let mut status = json!({
                "observedGeneration": generation,
                "disruptionsAllowed": allowed,
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "expectedPods": expected,
                "conditions": [{
                    "type": "DisruptionAllowed",
                    "status": cond_status,
                    "reason": reason,
                    "message": "",
                    "observedGeneration": generation,
                    "lastTransitionTime": transition,
                }],
            });
            if !disrupted.is_empty() {
                status["disruptedPods"] = Value::Object(disrupted);
            }
            if status != old_status {
                let mut new = pdb.clone();
                new["status"] = status;
                self.commit(r::PDBS, EventType::Modified, Some(pdb), new);
            }
        }
    }

    /// The sum of the scales of the pods' controllers, as the disruption controller's finders
    /// compute it: a ReplicaSet owned by a Deployment counts with the Deployment's replicas,
    /// StatefulSets and ReplicationControllers with theirs, each controller once. A pod without
    /// a controller, or whose controller is missing or has no scale (a Job, a custom
    /// resource), is an error.
    fn expected_scale(&self, ns: &str, pods: &[&Value]) -> Result<i64, String> {
        let mut seen: BTreeMap<String, i64> = BTreeMap::new();
        for p in pods {
            let pod_name = meta_str(p, "name").unwrap_or_default();
            let Some(owner) = p
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .and_then(|os| os.iter().find(|o| o["controller"] == true))
            else {
                return Err(format!("found no controller ref for pod {pod_name:?}"));
            };
            let kind = owner["kind"].as_str().unwrap_or_default();
            let name = owner["name"].as_str().unwrap_or_default();
            let uid = owner["uid"].as_str().unwrap_or_default();
            let lookup = |res: usize| self.get(res, ns, name).filter(|o| meta_str(o, "uid") == Some(uid));
            let replicas = |o: &Value| o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
            let found = match kind {
                "ReplicaSet" => lookup(r::REPLICASETS).map(|rs| {
                    let deployment = rs
                        .pointer("/metadata/ownerReferences")
                        .and_then(Value::as_array)
                        .and_then(|os| {
                            os.iter().find(|o| o["controller"] == true && o["kind"] == "Deployment")
                        })
                        .and_then(|d| {
                            self.get(r::DEPLOYMENTS, ns, d["name"].as_str().unwrap_or_default())
                                .filter(|dep| meta_str(dep, "uid") == d["uid"].as_str())
                        });
                    match deployment {
                        Some(d) => (meta_str(&d, "uid").unwrap_or_default().to_string(), replicas(&d)),
                        None => (uid.to_string(), replicas(&rs)),
                    }
                }),
                "StatefulSet" => lookup(r::STATEFULSETS).map(|o| (uid.to_string(), replicas(&o))),
                "ReplicationController" => {
                    lookup(r::REPLICATIONCONTROLLERS).map(|o| (uid.to_string(), replicas(&o)))
                }
                _ => None,
            };
            let Some((controller, scale)) = found else {
                return Err(format!("found no controllers for pod {pod_name:?}"));
            };
            seen.insert(controller, scale);
        }
        Ok(seen.values().sum())
    }

    /// The disruption controller's fail-safe: no disruptions allowed, a SyncFailed condition,
    /// and the generation left unobserved (so evictions answer "still being processed").
    fn fail_safe(&mut self, pdb: Value, old_status: &Value, why: &str, now: Timestamp) {
        let mut status = old_status.clone();
        if !status.is_object() {
            status = json!({});
        }
        status["disruptionsAllowed"] = json!(0);
        let observed = status.get("observedGeneration").and_then(Value::as_i64).unwrap_or(0);
        let old_cond = old_status
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"))
            .cloned();
        let transition = match &old_cond {
            Some(c) if c["status"] == "False" => c["lastTransitionTime"].clone(),
            _ => json!(ts(now)),
        };
        status["conditions"] = json!([{
            "type": "DisruptionAllowed",
            "status": "False",
            "reason": "SyncFailed",
            "message": why,
            "observedGeneration": observed,
            "lastTransitionTime": transition,
        }]);
        if status != *old_status {
            let mut new = pdb.clone();
            new["status"] = status;
            self.commit(r::PDBS, EventType::Modified, Some(pdb), new);
        }
    }

    /// The pods/eviction subresource (policy/v1 Eviction), with the real server's checks: pods
    /// that are not running or already terminating are deleted without consulting budgets; more
    /// than one matching PDB is a 500; an unready pod may go when the budget is met (or the PDB
    /// says `unhealthyPodEvictionPolicy: AlwaysAllow`); otherwise `disruptionsAllowed == 0` is
    /// a 429 naming the budget in `details.causes`, and an allowed eviction is recorded in the
    /// PDB's `disruptedPods` before the pod is deleted (graceful mode respected).
    pub fn evict(&mut self, ns: &str, name: &str, body: &Value, now: Timestamp) -> Result<(), ApiError> {
        if let Some(n) = body.pointer("/metadata/name").and_then(Value::as_str) {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "name in URL does not match name in Eviction object: {name} != {n}"
                )));
            }
        }
        let pod = self.get_or_404(r::PODS, ns, name)?;
        let opts = DeleteOptions::from_body(body.get("deleteOptions").unwrap_or(&Value::Null));
        let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
        let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
        if matches!(phase, "Succeeded" | "Failed" | "Pending") || terminating {
            self.delete(r::PODS, ns, name, &opts, now)?;
            return Ok(());
        }
        let pdbs: Vec<Value> = self
            .all(r::PDBS, Some(ns))
            .into_iter()
            .filter(|p| {
                LabelSelector::from_object(p.pointer("/spec/selector").unwrap_or(&Value::Null))
                    .ok()
                    .flatten()
                    .is_some_and(|s| s.matches(&pod))
            })
            .collect();
        if pdbs.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some(pdb) = pdbs.into_iter().next() {
            let pdb_name = meta_str(&pdb, "name").unwrap_or_default().to_string();
            let st = |f: &str| pdb.pointer(&format!("/status/{f}")).and_then(Value::as_i64).unwrap_or(0);
            let (healthy, desired) = (st("currentHealthy"), st("desiredHealthy"));
            let always = pdb.pointer("/spec/unhealthyPodEvictionPolicy").and_then(Value::as_str)
                == Some("AlwaysAllow");
            if !pod_ready(&pod) && (always || (healthy >= desired && desired > 0)) {
                self.delete(r::PODS, ns, name, &opts, now)?;
                return Ok(());
            }
            let too_many = |cause: String, retry: u64| {
                let mut e = ApiError::new(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                );
                e.details = json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]});
                e.retry_after = (retry > 0).then_some(retry);
                e
            };
            let retry = self.settings.eviction_retry_after_seconds;
            if st("observedGeneration")
                < pdb.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1)
            {
                return Err(too_many(
                    format!("The disruption budget {pdb_name} is still being processed by the server."),
                    retry,
                ));
            }
            let allowed = st("disruptionsAllowed");
            if allowed < 0 {
                return Err(ApiError::new(403, "Forbidden", "pdb disruptions allowed is negative"));
            }
            if allowed == 0 {
                return Err(too_many(
                    format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"),
                    retry,
                ));
            }
            // Precondition failures must not consume the budget.
            self.check_preconditions(&pod, &opts)?;
            let mut new = pdb.clone();
            new["status"]["disruptionsAllowed"] = json!(allowed - 1);
            if !new["status"]["disruptedPods"].is_object() {
                new["status"]["disruptedPods"] = json!({});
            }
            new["status"]["disruptedPods"][name] = json!(ts(now));
            self.commit(r::PDBS, EventType::Modified, Some(pdb), new);
        }
        self.delete(r::PODS, ns, name, &opts, now)?;
        Ok(())
    }

    /// The pods/binding subresource (core/v1 Binding), what a scheduler calls: sets
    /// `spec.nodeName` and the PodScheduled condition; a pod already assigned or being deleted
    /// is a 409 Conflict, like the real server.
    pub fn bind(&mut self, ns: &str, name: &str, body: &Value, now: Timestamp) -> Result<(), ApiError> {
        let rk = &RESOURCES[r::PODS];
        if let Some(n) = body.pointer("/metadata/name").and_then(Value::as_str) {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "name in URL does not match name in Binding object: {name} != {n}"
                )));
            }
        }
        let target_kind = body.pointer("/target/kind").and_then(Value::as_str).unwrap_or("Node");
        let node = body.pointer("/target/name").and_then(Value::as_str).unwrap_or_default();
        if !(target_kind.is_empty() || target_kind == "Node") || node.is_empty() {
            return Err(ApiError::invalid(
                &RESOURCES[r::PODS],
                name,
                &format!("target: Invalid value: must name a Node, got kind {target_kind:?} name {node:?}"),
            ));
        }
        let pod = self.get_or_404(r::PODS, ns, name)?;
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                rk,
                name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        let current = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
        if !current.is_empty() {
            return Err(ApiError::conflict(
                rk,
                name,
                &format!("pod {name} is already assigned to node {current:?}"),
            ));
        }
        let mut new = pod.clone();
        new["spec"]["nodeName"] = json!(node);
        if let Some(a) = body.pointer("/metadata/annotations").and_then(Value::as_object) {
            let m = meta_mut(&mut new);
            if !m.get("annotations").is_some_and(Value::is_object) {
                m.insert("annotations".into(), json!({}));
            }
            for (k, v) in a {
                m["annotations"][k] = v.clone();
            }
        }
        if !new["status"]["conditions"].is_array() {
            new["status"]["conditions"] = json!([]);
        }
        let conds = new["status"]["conditions"].as_array_mut().expect("conditions");
        conds.retain(|c| c["type"] != "PodScheduled");
        conds.push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(now)}));
        self.commit(r::PODS, EventType::Modified, Some(pod), new);
        self.after_change(r::PODS, ns, now);
        Ok(())
    }

    fn check_preconditions(&self, obj: &Value, opts: &DeleteOptions) -> Result<(), ApiError> {
        let name = meta_str(obj, "name").unwrap_or_default();
        let rk = &RESOURCES[r::PODS];
        if let Some(p) = &opts.uid {
            if Some(p.as_str()) != meta_str(obj, "uid") {
                return Err(ApiError::conflict(
                    rk,
                    name,
                    &format!("Precondition failed: UID in precondition: {p}"),
                ));
            }
        }
        if let Some(p) = &opts.resource_version {
            if Some(p.as_str()) != meta_str(obj, "resourceVersion") {
                return Err(ApiError::conflict(
                    rk,
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {p}"),
                ));
            }
        }
        Ok(())
    }

    /// The event a watch with these filters sees for a history entry, with selector
    /// transitions mapped like the watch cache does (leaving the selection is DELETED,
    /// entering it is ADDED).
    pub fn event_for(
        ev: &HistEvent,
        res: usize,
        ns: Option<&str>,
        sel: &Selectors,
    ) -> Option<(EventType, Value)> {
        if ev.res != storage(res) || ns.is_some_and(|n| n != ev.ns) {
            return None;
        }
        let obj = to_view(res, ev.obj.clone());
        let old = ev.old.clone().map(|o| to_view(res, o));
        let now_matches = sel.matches(&obj);
        let before = old.as_ref().is_some_and(|o| sel.matches(o));
        let kind = match ev.kind {
            EventType::Added => now_matches.then_some(EventType::Added),
            EventType::Deleted => (before || now_matches).then_some(EventType::Deleted),
            EventType::Modified => match (before, now_matches) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
        }?;
        Some((kind, obj))
    }

    /// Forgets the whole event history: any watch resuming from a resourceVersion issued so far
    /// gets 410 Gone (like an API server restart with a fresh watch cache). Bumps the
    /// resourceVersion once so a fresh list yields a resumable version.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.history.clear();
        self.compacted = self.rv;
        self.continues.clear();
        self.notify.send_replace(self.rv);
    }

    /// Builds the selectors of a request for a resource.
    pub fn selectors(res: usize, label: Option<&str>, field: Option<&str>) -> Result<Selectors, ApiError> {
        Ok(Selectors {
            labels: LabelSelector::parse(label.unwrap_or_default()).map_err(ApiError::bad_request)?,
            fields: FieldSelector::parse(field.unwrap_or_default(), &RESOURCES[res])
                .map_err(ApiError::bad_request)?,
        })
    }
}
