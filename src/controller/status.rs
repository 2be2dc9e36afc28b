//! What the controller tells people through the Kubernetes API: Events on the pods and nodes it
//! acts for, and status ConfigMaps (like Cluster Autoscaler's `cluster-autoscaler-status`).
//!
//! Events use `events.k8s.io/v1` through kube-rs' [`Recorder`], reported by controller
//! `gpuscale` with the pod name as instance: `TriggeredScaleUp` and `NotTriggerScaleUp` on pending
//! pods, `ScaleDown` on drained nodes, evicted pods and nodes being replaced (action `Replace`),
//! `ScaleUpFailed`/`ScaleDownFailed` warnings. The same (object, reason) is published once per
//! loop ([`StatusPublisher::begin_loop`]); across loops the recorder turns repeats into an event
//! series. What every plan repeats — `NotTriggerScaleUp` for every pod it cannot help, and in
//! dry runs the `TriggeredScaleUp` and `ScaleDown` events of actions never taken (thousands on a
//! large cluster, each with a lookup of the object) — is published again only when its gist (the
//! reason, the group) changes or [`REPEATED_EVENT_INTERVAL`] has passed, as client-go's event spam
//! filter lets an object's events through.
//!
//! The loop hands plans over without waiting ([`StatusHandle`]); a plan not yet published when
//! the next arrives is replaced by it, so a slow API server delays the status but never piles up
//! plans in memory.
//!
//! ConfigMaps, server-side applied with field manager `gpuscale` in the controller's namespace:
//! `gpuscale-status-<group>` per node group (sizes, node counts, last scale-up/-down, backoff,
//! the group's part of the last plan) and `gpuscale-status` with the whole last plan as YAML.
//! In dry-run mode the maps are `gpuscale-dry-run-status…` (a dry-run replica can run next to the
//! acting one), carry `dryRun: "true"`, and the events say what *would* happen.
//!
//! Publishing is best effort: failures are logged and counted (`gpuscale_errors_total{kind=
//! "status"}`), never returned, so that a status problem never stops scaling. ConfigMap writes
//! that keep failing are made visible where people look: `/readyz` fails (see
//! [`super::health::Health::ready`]), an error is logged and a `StatusWriteFailed` warning Event
//! lands on the controller's own pod.

use super::health::{Health, STATUS_FAILURES_UNREADY};
use super::leader::Fence;
use super::metrics::Metrics;
use crate::model::{dollars, ClusterSnapshot, NodeGroup, NodeState};
use crate::planner::cluster::GroupIndex;
use crate::planner::Plan;
use crate::shown::shown;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Field manager of the server-side applied ConfigMaps, and reporting controller of events.
pub const FIELD_MANAGER: &str = "gpuscale";
/// Name of the cluster-wide status ConfigMap.
pub const STATUS_CONFIGMAP: &str = "gpuscale-status";

/// What a dry-run replica's maps are called instead of `gpuscale-status…`, so that it can run next
/// to the acting controller without overwriting its status.
pub const DRY_RUN_STATUS_CONFIGMAP: &str = "gpuscale-dry-run-status";

/// `name` (a `gpuscale-status…` map) as a dry-run replica calls it.
fn in_mode(name: &str, dry_run: bool) -> String {
    match name.strip_prefix(STATUS_CONFIGMAP) {
        Some(rest) if dry_run => format!("{DRY_RUN_STATUS_CONFIGMAP}{rest}"),
        _ => name.to_string(),
    }
}

/// Event reasons, as `kubectl get events` shows them.
pub mod reason {
    /// A scale-up was (or would be) made for a pending pod.
    pub const TRIGGERED_SCALE_UP: &str = "TriggeredScaleUp";
    /// No node group can serve a pending pod.
    pub const NOT_TRIGGER_SCALE_UP: &str = "NotTriggerScaleUp";
    /// A node is drained/removed, or a pod evicted for it.
    pub const SCALE_DOWN: &str = "ScaleDown";
    /// A scale-down could not proceed.
    pub const SCALE_DOWN_FAILED: &str = "ScaleDownFailed";
    /// The cloud refused a scale-up.
    pub const SCALE_UP_FAILED: &str = "ScaleUpFailed";
    /// A pod was evicted so that a pending pod fits (tenancy preemption; kube-scheduler's word).
    pub const PREEMPTED: &str = "Preempted";
    /// An object was left out of the plan: a value in it is past a bound of gpuscale's limits.
    pub const OBJECT_REFUSED: &str = "ObjectRefused";
    /// Status ConfigMaps keep failing to be written (on the controller's pod).
    pub const STATUS_WRITE_FAILED: &str = "StatusWriteFailed";
}

/// Sanitises `s` into a DNS-1123 subdomain fragment: lower case, `[a-z0-9-]`, runs of other
/// characters collapsed into one `-`, no leading/trailing `-`, at most `max` characters.
pub fn dns1123(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(max);
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Short name of a group id (`gpu-h100` of `aws/prod/gpu-h100`).
fn short_name(group_id: &str) -> &str {
    group_id.rsplit('/').next().unwrap_or(group_id)
}

/// Name of the status ConfigMap of `group_id`: `gpuscale-status-<short name>`, or with the whole
/// id when another of `all_ids` has the same short name (two accounts with a `gpu` group).
pub fn group_configmap_name<'a>(group_id: &str, all_ids: impl IntoIterator<Item = &'a str>) -> String {
    let short = dns1123(short_name(group_id), 200);
    let clash =
        all_ids.into_iter().any(|other| other != group_id && dns1123(short_name(other), 200) == short);
    let part = if clash { dns1123(group_id, 200) } else { short };
    format!("{STATUS_CONFIGMAP}-{}", if part.is_empty() { "unnamed".into() } else { part })
}

/// The object an event is about.
#[derive(Clone, Copy)]
struct Target<'a> {
    kind: &'a str,
    namespace: Option<&'a str>,
    name: &'a str,
}

/// What the publisher remembers about one group between loops.
#[derive(Debug, Clone, Default)]
struct GroupMemory {
    last_scale_up: Option<(Timestamp, String)>,
    last_scale_up_failure: Option<(Timestamp, String)>,
    last_scale_down: Option<(Timestamp, String)>,
    backoff: Option<(Timestamp, String)>,
}

#[derive(Default)]
struct Memory {
    groups: BTreeMap<String, GroupMemory>,
    group_ids: Vec<String>,
    published: HashSet<(String, String, String, String)>,
    uids: HashMap<(String, String, String), Option<String>>,
    /// Events every plan repeats, by kind (`NotTriggerScaleUp`, dry-run `TriggeredScaleUp`,
    /// `ScaleDown`, `Replace`): per object, the gist published and when, while the plan keeps
    /// repeating it.
    repeated: HashMap<&'static str, HashMap<String, (String, Instant)>>,
}

/// How long an event a plan repeats unchanged is not published again (client-go's event spam
/// filter lets one event per object through every 5 minutes once its burst is spent).
pub const REPEATED_EVENT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(300);

/// Each group's nodes by state (Ready, Initializing, Upcoming, Deleting, Unready), for the status
/// ConfigMaps.
pub type NodeCounts = BTreeMap<String, [usize; 5]>;

/// Counts the nodes of each of `groups` in `snapshot` by state.
pub fn node_counts(snapshot: &ClusterSnapshot, groups: &[NodeGroup]) -> NodeCounts {
    let mut counts: NodeCounts = groups.iter().map(|g| (g.id.clone(), [0; 5])).collect();
    let index = GroupIndex::of(groups);
    for n in &snapshot.nodes {
        let Some(g) = index.group_of(n) else { continue };
        let Some(c) = counts.get_mut(&groups[g].id) else { continue };
        c[match n.state {
            NodeState::Ready => 0,
            NodeState::Initializing => 1,
            NodeState::Upcoming => 2,
            NodeState::Deleting => 3,
            NodeState::Unready => 4,
        }] += 1;
    }
    counts
}

/// Publishes events and status ConfigMaps for the controller. Cheap to share behind an `Arc`.
pub struct StatusPublisher {
    client: Client,
    namespace: String,
    recorder: Recorder,
    /// The controller's pod name (events' reporting instance).
    instance: String,
    metrics: Option<Arc<Metrics>>,
    health: Option<Arc<Health>>,
    dry_run: AtomicBool,
    memory: Mutex<Memory>,
    /// The controller's leadership: outside dry runs nothing is written without it, so that a
    /// deposed leader's queued Events and ConfigMaps do not overwrite its successor's. `None`:
    /// unfenced (the publisher is used without an elector).
    fence: Mutex<Option<Fence>>,
}

/// The cluster-wide status document (`gpuscale-status` ConfigMap, key `status.yaml`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusDoc<'a> {
    time: String,
    dry_run: bool,
    node_groups: Vec<GroupDoc>,
    plan: &'a Plan,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupDoc {
    id: String,
    config_map: String,
    min_size: u32,
    max_size: u32,
    target_size: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    backoff_until: Option<String>,
}

/// What the status ConfigMap's plan may take, as YAML and as the summary table: the API server
/// refuses ConfigMaps over 1 MiB, and the groups' lines come besides.
const STATUS_PLAN_BYTES: usize = 900 * 1024;

/// The plan as the status ConfigMap can hold it: on a large cluster the per-pod and per-node
/// lists (placements of thousands of pending pods, nodes kept) are cut, longest first, until the
/// plan fits, and what was left out is said. Actions (scale-ups, scale-downs, replacements) are
/// never cut: each is bounded by the plan's own limits.
fn fitted(plan: &Plan, groups: usize) -> (Plan, Option<String>) {
    let size = |p: &Plan| serde_yaml::to_string(p).map_or(0, |y| y.len()) + p.to_table().len() + groups * 512;
    if size(plan) <= STATUS_PLAN_BYTES {
        return (plan.clone(), None);
    }
    let mut p = plan.clone();
    let mut omitted: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    while size(&p) > STATUS_PLAN_BYTES {
        let lengths = [
            ("placements", p.placements.len()),
            ("unschedulable", p.unschedulable.len()),
            ("kept", p.kept.len()),
            ("idleGpus", p.idle_gpus.len()),
            ("warnings", p.warnings.len()),
        ];
        let Some(&(longest, n)) = lengths.iter().max_by_key(|(_, n)| *n).filter(|(_, n)| *n > 0) else {
            break;
        };
        let keep = n / 2;
        match longest {
            "placements" => p.placements.truncate(keep),
            "unschedulable" => p.unschedulable.truncate(keep),
            "kept" => p.kept.truncate(keep),
            "idleGpus" => p.idle_gpus.truncate(keep),
            _ => p.warnings.truncate(keep),
        }
        omitted.entry(longest).or_insert((n, 0)).1 = keep;
    }
    let said: Vec<String> = omitted
        .iter()
        .map(|(list, (total, kept))| format!("{list}: {} of {total} left out", total - kept))
        .collect();
    let note =
        format!("the plan is too large for a ConfigMap; {} (gpuscale plan shows all of it)", said.join(", "));
    (p, Some(note))
}

fn usd(micro: u64) -> String {
    format!("${:.2}/h", micro as f64 / dollars(1.0) as f64)
}

/// `namespace/name` → (namespace, name); a bare name is in `default`.
pub(super) fn split_pod(pod: &str) -> (&str, &str) {
    pod.split_once('/').unwrap_or(("default", pod))
}

impl StatusPublisher {
    /// A publisher writing ConfigMaps to `namespace` (the controller's) and events as
    /// `gpuscale`/`instance` (the pod name, `POD_NAME`).
    pub fn new(client: Client, namespace: impl Into<String>, instance: impl Into<String>) -> Self {
        let instance = instance.into();
        let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: Some(instance.clone()) };
        StatusPublisher {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: namespace.into(),
            instance,
            metrics: None,
            health: None,
            dry_run: AtomicBool::new(false),
            memory: Mutex::new(Memory::default()),
            fence: Mutex::new(None),
        }
    }

    /// Writes only while `fence` holds (dry runs aside, whose ConfigMaps are their own).
    pub fn set_fence(&self, fence: Fence) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = Some(fence);
    }

    /// Whether a write may be issued now; logs the one that may not (`what` is only formatted
    /// then: events are written by the thousand).
    fn may_write(&self, what: impl FnOnce() -> String) -> bool {
        if self.is_dry_run() {
            return true;
        }
        let fence = self.fence.lock().unwrap_or_else(|p| p.into_inner());
        let holds = fence.as_ref().is_none_or(Fence::holds);
        if !holds {
            tracing::debug!("status: {} not written: this replica does not lead any more", what());
        }
        holds
    }

    /// Counts publishing failures in `metrics` (`errors_total{kind="status"}`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reports ConfigMap writes to `health`, whose readiness fails while they keep failing.
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = Some(health);
        self
    }

    /// The namespace the status ConfigMaps go to.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, what: &str, err: &kube::Error) {
        match err {
            // A refusal repeats on every loop until someone fixes the RBAC: say so loudly.
            kube::Error::Api(e) if e.code == 401 || e.code == 403 => tracing::error!(
                error = %err,
                "status: {what} refused; the controller's ServiceAccount lacks the chart's RBAC"
            ),
            _ => tracing::warn!(error = %err, "status: {what} failed"),
        }
        if let Some(m) = &self.metrics {
            m.error("status");
        }
    }

    /// Starts a new loop: events published from now on are new again for deduplication, and
    /// object uids are looked up afresh.
    pub fn begin_loop(&self) {
        let mut mem = self.memory();
        mem.published.clear();
        mem.uids.clear();
    }

    fn is_dry_run(&self) -> bool {
        self.dry_run.load(Ordering::Acquire)
    }

    async fn uid_of(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<String> {
        let key = (kind.to_string(), namespace.unwrap_or_default().to_string(), name.to_string());
        if let Some(uid) = self.memory().uids.get(&key) {
            return uid.clone();
        }
        let uid = match (kind, namespace) {
            ("Pod", Some(ns)) => Api::<Pod>::namespaced(self.client.clone(), ns).get_opt(name).await,
            ("Node", _) => Api::<Node>::all(self.client.clone())
                .get_opt(name)
                .await
                .map(|n| n.map(|n| Pod { metadata: n.metadata, ..Default::default() })),
            ("ConfigMap", Some(ns)) => Api::<ConfigMap>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .map(|c| c.map(|c| Pod { metadata: c.metadata, ..Default::default() })),
            _ => Ok(None),
        };
        let uid = match uid {
            Ok(obj) => obj.and_then(|o| o.metadata.uid),
            Err(e) => {
                tracing::debug!(error = %e, "status: looking up the uid of {kind} {name}");
                None
            }
        };
        self.memory().uids.insert(key, uid.clone());
        uid
    }

    async fn reference(&self, kind: &str, namespace: Option<&str>, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
            namespace: namespace.map(str::to_string),
            name: Some(name.into()),
            uid: self.uid_of(kind, namespace, name).await,
            ..Default::default()
        }
    }

    /// Publishes one event unless the same (object, reason) was published in this loop.
    async fn event(
        &self,
        Target { kind, namespace, name }: Target<'_>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let key = (
            kind.to_string(),
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
            reason.to_string(),
        );
        if !self.may_write(|| format!("event {reason} on {kind} {name}"))
            || !self.memory().published.insert(key)
        {
            return;
        }
        let reference = self.reference(kind, namespace, name).await;
        // Names and reasons in the note come from the cluster and the clouds; the API limits
        // notes to 1 kB.
        let mut note = shown(&note).into_owned();
        if note.len() > 1024 {
            let mut cut = 1021;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let ev =
            Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            self.failed(&format!("event {reason} on {kind} {name}"), &e);
        }
    }

    async fn pod_event(&self, pod: &str, type_: EventType, reason: &str, action: &str, note: String) {
        let (ns, name) = split_pod(pod);
        self.event(Target { kind: "Pod", namespace: Some(ns), name }, type_, reason, action, note).await;
    }

    async fn node_event(&self, node: &str, type_: EventType, reason: &str, action: &str, note: String) {
        self.event(Target { kind: "Node", namespace: None, name: node }, type_, reason, action, note).await;
    }

    fn group_cm(&self, group: &str) -> String {
        let mem = self.memory();
        in_mode(&group_configmap_name(group, mem.group_ids.iter().map(String::as_str)), self.is_dry_run())
    }

    /// The objects of `current` (object, gist), which every plan repeats as events of `kind`,
    /// whose event is due: never published, its gist changed, or published
    /// [`REPEATED_EVENT_INTERVAL`] ago. Objects the plan no longer names are forgotten, so the
    /// memory follows the plan's size and an object named again is news again.
    fn due<'p>(
        &self,
        kind: &'static str,
        current: impl IntoIterator<Item = (&'p str, &'p str)>,
        now: Instant,
    ) -> HashSet<&'p str> {
        let mut mem = self.memory();
        let told = mem.repeated.entry(kind).or_default();
        let current: HashMap<&str, &str> = current.into_iter().collect();
        told.retain(|object, _| current.contains_key(object.as_str()));
        let mut due = HashSet::new();
        for (&object, &gist) in &current {
            let fresh = match told.get(object) {
                Some((said, at)) => said != gist || now.duration_since(*at) >= REPEATED_EVENT_INTERVAL,
                None => true,
            };
            if fresh {
                told.insert(object.to_string(), (gist.to_string(), now));
                due.insert(object);
            }
        }
        due
    }

    /// Publishes a loop's plan: `NotTriggerScaleUp` on unschedulable pods, in dry-run mode the
    /// events of the actions that would be taken, and the status ConfigMaps. Node counts are
    /// left out; [`StatusPublisher::publish_plan_with_nodes`] adds them.
    pub async fn publish_plan(&self, plan: &Plan, groups: &[NodeGroup], dry_run: bool) {
        self.publish(plan, groups, None, dry_run).await;
    }

    /// [`StatusPublisher::publish_plan`] with each group's node counts by state from `snapshot`.
    pub async fn publish_plan_with_nodes(
        &self,
        plan: &Plan,
        groups: &[NodeGroup],
        snapshot: &ClusterSnapshot,
        dry_run: bool,
    ) {
        self.publish(plan, groups, Some(&node_counts(snapshot, groups)), dry_run).await;
    }

    async fn publish(&self, plan: &Plan, groups: &[NodeGroup], counts: Option<&NodeCounts>, dry_run: bool) {
        self.dry_run.store(dry_run, Ordering::Release);
        self.memory().group_ids = groups.iter().map(|g| g.id.clone()).collect();

        let now = Instant::now();
        let unschedulable = plan.unschedulable.iter().map(|u| (u.pod.as_str(), u.reason.as_str()));
        let due = self.due(reason::NOT_TRIGGER_SCALE_UP, unschedulable, now);
        for u in plan.unschedulable.iter().filter(|u| due.contains(u.pod.as_str())) {
            let note = format!("pod didn't trigger scale-up: {}", u.reason);
            self.pod_event(&u.pod, EventType::Normal, reason::NOT_TRIGGER_SCALE_UP, "ScaleUp", note).await;
        }
        if dry_run {
            // Nothing is done in a dry run, so every plan proposes the same actions again.
            let triggering =
                plan.scale_ups.iter().flat_map(|a| a.pods.iter().map(|p| (p.as_str(), a.group.as_str())));
            let due_pods = self.due(reason::TRIGGERED_SCALE_UP, triggering, now);
            for a in &plan.scale_ups {
                let pods: Vec<String> =
                    a.pods.iter().filter(|p| due_pods.contains(p.as_str())).cloned().collect();
                self.announce_scale_up(&a.group, a.from, a.to, &pods).await;
            }
            let removing = plan.scale_downs.iter().map(|a| (a.node.as_str(), a.reason.as_str()));
            let due_nodes = self.due("ScaleDown", removing, now);
            for a in plan.scale_downs.iter().filter(|a| due_nodes.contains(a.node.as_str())) {
                let note = format!("would remove node from group {} (dry run): {}", a.group, a.reason);
                self.node_event(&a.node, EventType::Normal, reason::SCALE_DOWN, "ScaleDown", note).await;
            }
            let replacing = plan.replacements.iter().map(|a| (a.node.as_str(), a.replacement_group.as_str()));
            let due_nodes = self.due("Replace", replacing, now);
            for a in plan.replacements.iter().filter(|a| due_nodes.contains(a.node.as_str())) {
                let note = format!(
                    "would replace node of group {} by one node of {} (dry run), saving {}",
                    a.group,
                    a.replacement_group,
                    usd(a.saving_per_hour)
                );
                self.node_event(&a.node, EventType::Normal, reason::SCALE_DOWN, "Replace", note).await;
            }
        }

        let now = Timestamp::now();
        let ids: Vec<&str> = groups.iter().map(|g| g.id.as_str()).collect();
        let memory: BTreeMap<String, GroupMemory> = self.memory().groups.clone();
        let mut docs = Vec::with_capacity(groups.len());
        for g in groups {
            let name = in_mode(&group_configmap_name(&g.id, ids.iter().copied()), dry_run);
            let mem = memory.get(&g.id).cloned().unwrap_or_default();
            let counts = counts.map(|c| c.get(&g.id).copied().unwrap_or_default());
            let data = group_data(plan, g, &mem, counts, dry_run, now);
            docs.push(GroupDoc {
                id: g.id.clone(),
                config_map: name.clone(),
                min_size: g.min_size,
                max_size: g.max_size,
                target_size: g.target_size,
                backoff_until: mem
                    .backoff
                    .as_ref()
                    .filter(|(until, _)| *until > now)
                    .map(|(u, _)| u.to_string()),
            });
            self.apply_configmap(&name, data).await;
        }

        let (plan, omitted) = fitted(plan, docs.len());
        let doc = StatusDoc { time: now.to_string(), dry_run, node_groups: docs, plan: &plan };
        let mut data = BTreeMap::new();
        match serde_yaml::to_string(&doc) {
            Ok(yaml) => {
                data.insert("status.yaml".to_string(), yaml);
            }
            Err(e) => {
                tracing::warn!(error = %e, "status: serialising the plan failed");
                if let Some(m) = &self.metrics {
                    m.error("status");
                }
            }
        }
        if let Some(omitted) = omitted {
            data.insert("omitted".into(), omitted);
        }
        data.insert("summary".into(), plan.to_table());
        data.insert("dryRun".into(), dry_run.to_string());
        data.insert("lastUpdated".into(), now.to_string());
        self.apply_configmap(&in_mode(STATUS_CONFIGMAP, dry_run), data).await;
    }

    async fn apply_configmap(&self, name: &str, data: BTreeMap<String, String>) {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    ("app.kubernetes.io/name".to_string(), "gpuscale".to_string()),
                    ("app.kubernetes.io/component".to_string(), "status".to_string()),
                ])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        if !self.may_write(|| format!("ConfigMap {}/{name}", self.namespace)) {
            return;
        }
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let result = api.patch(name, &params, &Patch::Apply(&cm)).await;
        if let Err(e) = &result {
            self.failed(&format!("applying ConfigMap {}/{name}", self.namespace), e);
        }
        let Some(health) = &self.health else { return };
        let error = result.err().map(|e| e.to_string());
        let failures = health.status_written(error.as_deref().map_or(Ok(()), Err));
        if failures == STATUS_FAILURES_UNREADY {
            let note = format!(
                "{failures} status ConfigMap writes in {} failed in a row; the replica reports unready until one succeeds: {}",
                self.namespace,
                error.unwrap_or_default()
            );
            tracing::error!("status: {note}");
            let pod = format!("{}/{}", self.namespace, self.instance);
            self.pod_event(&pod, EventType::Warning, reason::STATUS_WRITE_FAILED, "Publish", note).await;
        }
    }

    async fn announce_scale_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
        let note = if self.is_dry_run() {
            format!(
                "pod would trigger scale-up (dry run): group {group} {from}->{to} (+{})",
                to.saturating_sub(from)
            )
        } else {
            format!("pod triggered scale-up: group {group} {from}->{to} (+{})", to.saturating_sub(from))
        };
        for pod in pods {
            self.pod_event(pod, EventType::Normal, reason::TRIGGERED_SCALE_UP, "ScaleUp", note.clone()).await;
        }
    }

    /// Reports a scale-up of `group` from `from` to `to` nodes that the cloud accepted, for
    /// `pods`: `TriggeredScaleUp` on each pod, and the group's last scale-up.
    pub async fn scale_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
        self.record_scale_up(group, format!("{from}->{to} for {} pending pod(s)", pods.len()));
        self.announce_scale_up(group, from, to, pods).await;
    }

    /// The group's last scale-up, shown in its status ConfigMap; nothing is raised in dry runs.
    fn record_scale_up(&self, group: &str, why: String) {
        if !self.is_dry_run() {
            self.memory().groups.entry(group.into()).or_default().last_scale_up =
                Some((Timestamp::now(), why));
        }
    }

    /// Reports that `group` was raised for a node that replaces `node`: `ScaleDown` (action
    /// `Replace`) on the node, and the group's last scale-up. The node's pods are not told of a
    /// scale-up: they are running.
    pub async fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32) {
        self.record_scale_up(group, format!("{from}->{to} to replace node {node}"));
        let note = format!(
            "requested a node of group {group} ({from}->{to}) to replace this node; it is drained once \
             the new node holds its pods"
        );
        self.node_event(node, EventType::Normal, reason::SCALE_DOWN, "Replace", note).await;
    }

    /// Reports a scale-up of `group` the cloud refused: a `ScaleUpFailed` warning on the group's
    /// status ConfigMap, and the group's last failure.
    pub async fn scale_up_failed(&self, group: &str, error: &str) {
        self.memory().groups.entry(group.into()).or_default().last_scale_up_failure =
            Some((Timestamp::now(), error.to_string()));
        let cm = self.group_cm(group);
        let note = format!("scale-up of group {group} failed: {error}");
        let ns = self.namespace.clone();
        let target = Target { kind: "ConfigMap", namespace: Some(&ns), name: &cm };
        self.event(target, EventType::Warning, reason::SCALE_UP_FAILED, "ScaleUp", note).await;
    }

    /// Records that `group` is backed off until `until` (after failed scale-ups), or no longer
    /// (`None`); shown in the group's status ConfigMap from the next [`StatusPublisher::publish_plan`].
    pub fn set_backoff(&self, group: &str, backoff: Option<(Timestamp, String)>) {
        self.memory().groups.entry(group.into()).or_default().backoff = backoff;
    }

    /// Reports that `node` is cordoned and being drained: `ScaleDown` on the node.
    pub async fn drain_started(&self, node: &str, why: &str) {
        let note = if self.is_dry_run() {
            format!("would drain node for removal (dry run): {why}")
        } else {
            format!("marked the node unschedulable and started draining it for removal: {why}")
        };
        self.node_event(node, EventType::Normal, reason::SCALE_DOWN, "Drain", note).await;
    }

    /// Reports that `pod` was evicted from `node` for its removal: `ScaleDown` on the pod.
    pub async fn pod_evicted(&self, pod: &str, node: &str) {
        let note = format!("evicting pod from node {node} for scale down");
        self.pod_event(pod, EventType::Normal, reason::SCALE_DOWN, "Evict", note).await;
    }

    /// Reports that `pod` cannot be evicted from `node` (PDB, do-not-disrupt, ...): a
    /// `ScaleDownFailed` warning on the node and on the pod.
    pub async fn eviction_blocked(&self, pod: &str, node: &str, why: &str) {
        let note = format!("cannot evict pod {pod} from node {node}: {why}");
        self.node_event(node, EventType::Warning, reason::SCALE_DOWN_FAILED, "Evict", note.clone()).await;
        self.pod_event(pod, EventType::Warning, reason::SCALE_DOWN_FAILED, "Evict", note).await;
    }

    /// Reports that `victim` was evicted from `node` for the pending `preemptor`: `Preempted` on
    /// the victim, as kube-scheduler's preemption says it.
    pub async fn preempted(&self, victim: &str, node: &str, preemptor: &str, why: &str) {
        let note = format!("preempted on node {node} so that pending pod {preemptor} fits: {why}");
        self.pod_event(victim, EventType::Normal, reason::PREEMPTED, "Preempt", note).await;
    }

    /// Reports that removing `node` failed: a `ScaleDownFailed` warning on the node.
    pub async fn scale_down_failed(&self, node: &str, group: &str, error: &str) {
        let note = format!("removing node from group {group} failed: {error}");
        self.node_event(node, EventType::Warning, reason::SCALE_DOWN_FAILED, "ScaleDown", note).await;
    }

    /// An Event on a ProvisioningRequest whose condition changed (reason: the condition's
    /// reason; a Warning when it failed or its capacity is not found).
    pub async fn request_condition(
        &self,
        request: &str,
        uid: Option<String>,
        condition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
    ) {
        let (ns, name) = split_pod(request);
        let reference = ObjectReference {
            api_version: Some(super::provisioning::API_VERSION.into()),
            kind: Some("ProvisioningRequest".into()),
            namespace: Some(ns.into()),
            name: Some(name.into()),
            uid,
            ..Default::default()
        };
        let warning = condition.type_ == "Failed" || condition.reason == "CapacityIsNotFound";
        let note =
            shown(&format!("{}={}: {}", condition.type_, condition.status, condition.message)).into_owned();
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: condition.reason.clone(),
            note: Some(note.chars().take(1000).collect()),
            action: "Provision".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            self.failed(&format!("event {} on ProvisioningRequest {request}", condition.reason), &e);
        }
    }

    /// A Warning Event `ObjectRefused` on each object left out of this pass for a value past a
    /// bound, naming the field, the value and the bound; repeated as the other standing
    /// conditions are (when it changes, and every [`REPEATED_EVENT_INTERVAL`]).
    pub async fn objects_refused(&self, refused: &[crate::k8s::RefusedObject]) {
        let key = |r: &crate::k8s::RefusedObject| {
            format!("{} {}/{}", r.kind, r.namespace.as_deref().unwrap_or_default(), r.name)
        };
        let keys: Vec<(String, String)> = refused.iter().map(|r| (key(r), r.to_string())).collect();
        let due: HashSet<String> = self
            .due(reason::OBJECT_REFUSED, keys.iter().map(|(k, g)| (k.as_str(), g.as_str())), Instant::now())
            .into_iter()
            .map(str::to_string)
            .collect();
        for r in refused.iter().filter(|r| due.contains(&key(r))) {
            let reference = ObjectReference {
                api_version: Some(r.api_version.clone()),
                kind: Some(r.kind.clone()),
                namespace: r.namespace.clone(),
                name: Some(r.name.clone()),
                uid: r.uid.clone(),
                ..Default::default()
            };
            let note = format!("left out of gpuscale's plans: {} = {:?}: {}", r.field, r.value, r.reason);
            let ev = Event {
                type_: EventType::Warning,
                reason: reason::OBJECT_REFUSED.into(),
                note: Some(note.chars().take(1000).collect()),
                action: "Read".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&ev, &reference).await {
                self.failed(&format!("event {} on {}", reason::OBJECT_REFUSED, key(r)), &e);
            }
        }
    }

    /// Reports that `node` of `group` was drained and its instance deleted: `ScaleDown` on the
    /// node, and the group's last scale-down.
    pub async fn node_deleted(&self, node: &str, group: &str) {
        self.memory().groups.entry(group.into()).or_default().last_scale_down =
            Some((Timestamp::now(), format!("removed node {node}")));
        let note = format!("node removed from group {group} by gpuscale");
        self.node_event(node, EventType::Normal, reason::SCALE_DOWN, "Delete", note).await;
    }
}

/// One request to the status task of a [`StatusHandle`].
enum Msg {
    BeginLoop,
    /// The newest plan is waiting in the handle's slot.
    Plan,
    ScaleUp {
        group: String,
        from: u32,
        to: u32,
        pods: Vec<String>,
    },
    ReplacementRequested {
        node: String,
        group: String,
        from: u32,
        to: u32,
    },
    ScaleUpFailed {
        group: String,
        error: String,
    },
    Backoff {
        group: String,
        backoff: Option<(Timestamp, String)>,
    },
    DrainStarted {
        node: String,
        why: String,
    },
    PodEvicted {
        pod: String,
        node: String,
    },
    EvictionBlocked {
        pod: String,
        node: String,
        why: String,
    },
    ScaleDownFailed {
        node: String,
        group: String,
        error: String,
    },
    Preempted {
        victim: String,
        node: String,
        preemptor: String,
        why: String,
    },
    NodeDeleted {
        node: String,
        group: String,
    },
    RequestCondition {
        request: String,
        uid: Option<String>,
        condition: Box<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    },
    ObjectsRefused(Vec<crate::k8s::RefusedObject>),
    Fence(Fence),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Messages a [`StatusHandle`] queues before it drops new ones (an API server that is down must
/// not make the controller's memory grow).
pub const STATUS_QUEUE: usize = 1024;

/// A non-blocking front of a [`StatusPublisher`] for the reconcile loop: every method queues the
/// call for a task that publishes in order, so the loop never waits for the API server. A full
/// queue drops the call (logged, counted as `errors_total{kind="status_dropped"}`).
#[derive(Clone)]
pub struct StatusHandle {
    tx: tokio::sync::mpsc::Sender<Msg>,
    metrics: Option<Arc<Metrics>>,
    /// The newest plan not yet taken by the task; a newer one replaces it.
    latest: Arc<Mutex<Option<QueuedPlan>>>,
}

/// A plan waiting to be published, with what its ConfigMaps show besides.
struct QueuedPlan {
    plan: Plan,
    groups: Vec<NodeGroup>,
    counts: Option<NodeCounts>,
    dry_run: bool,
}

impl StatusPublisher {
    /// Moves the publisher into a task on the current tokio runtime; the task ends when every
    /// handle is dropped.
    pub fn spawn(self) -> (StatusHandle, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(STATUS_QUEUE);
        let latest: Arc<Mutex<Option<QueuedPlan>>> = Arc::default();
        let handle = StatusHandle { tx, metrics: self.metrics.clone(), latest: latest.clone() };
        let task = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                match msg {
                    Msg::BeginLoop => self.begin_loop(),
                    Msg::Plan => {
                        let newest = latest.lock().unwrap_or_else(|p| p.into_inner()).take();
                        if let Some(p) = newest {
                            self.publish(&p.plan, &p.groups, p.counts.as_ref(), p.dry_run).await;
                        }
                    }
                    Msg::ScaleUp { group, from, to, pods } => self.scale_up(&group, from, to, &pods).await,
                    Msg::ReplacementRequested { node, group, from, to } => {
                        self.replacement_requested(&node, &group, from, to).await
                    }
                    Msg::ScaleUpFailed { group, error } => self.scale_up_failed(&group, &error).await,
                    Msg::Backoff { group, backoff } => self.set_backoff(&group, backoff),
                    Msg::DrainStarted { node, why } => self.drain_started(&node, &why).await,
                    Msg::PodEvicted { pod, node } => self.pod_evicted(&pod, &node).await,
                    Msg::EvictionBlocked { pod, node, why } => self.eviction_blocked(&pod, &node, &why).await,
                    Msg::ScaleDownFailed { node, group, error } => {
                        self.scale_down_failed(&node, &group, &error).await
                    }
                    Msg::NodeDeleted { node, group } => self.node_deleted(&node, &group).await,
                    Msg::Preempted { victim, node, preemptor, why } => {
                        self.preempted(&victim, &node, &preemptor, &why).await
                    }
                    Msg::RequestCondition { request, uid, condition } => {
                        self.request_condition(&request, uid, &condition).await
                    }
                    Msg::ObjectsRefused(refused) => self.objects_refused(&refused).await,
                    Msg::Fence(fence) => self.set_fence(fence),
                    Msg::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        (handle, task)
    }
}

impl StatusHandle {
    /// Queues `msg`; false when it was dropped.
    fn send(&self, msg: Msg) -> bool {
        let Err(e) = self.tx.try_send(msg) else { return true };
        let why = match e {
            tokio::sync::mpsc::error::TrySendError::Full(_) => "queue full",
            tokio::sync::mpsc::error::TrySendError::Closed(_) => "status task ended",
        };
        tracing::warn!("status: dropped an update ({why})");
        if let Some(m) = &self.metrics {
            m.error("status_dropped");
        }
        false
    }

    /// See [`StatusPublisher::set_fence`]; calls queued before it are published unfenced.
    pub fn set_fence(&self, fence: Fence) {
        self.send(Msg::Fence(fence));
    }

    /// See [`StatusPublisher::begin_loop`].
    pub fn begin_loop(&self) {
        self.send(Msg::BeginLoop);
    }

    /// See [`StatusPublisher::publish_plan_with_nodes`]; without a snapshot, node counts are left
    /// out. Only the group counts are taken from the snapshot. A plan the task has not taken yet
    /// is replaced by this one (it keeps the earlier one's place in the queue).
    pub fn publish_plan(
        &self,
        plan: &Plan,
        groups: &[NodeGroup],
        snapshot: Option<&ClusterSnapshot>,
        dry_run: bool,
    ) {
        let queued = QueuedPlan {
            plan: plan.clone(),
            groups: groups.to_vec(),
            counts: snapshot.map(|s| node_counts(s, groups)),
            dry_run,
        };
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let replaced = latest.replace(queued).is_some();
        // The first plan in the slot queues the task's turn; without it the slot would never be
        // read, so a dropped turn takes the plan back out.
        if !replaced && !self.send(Msg::Plan) {
            latest.take();
        }
    }

    /// See [`StatusPublisher::scale_up`].
    pub fn scale_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
        self.send(Msg::ScaleUp { group: group.into(), from, to, pods: pods.to_vec() });
    }

    /// See [`StatusPublisher::scale_up_failed`].
    pub fn scale_up_failed(&self, group: &str, error: &str) {
        self.send(Msg::ScaleUpFailed { group: group.into(), error: error.into() });
    }

    /// See [`StatusPublisher::set_backoff`].
    pub fn set_backoff(&self, group: &str, backoff: Option<(Timestamp, String)>) {
        self.send(Msg::Backoff { group: group.into(), backoff });
    }

    /// See [`StatusPublisher::replacement_requested`].
    pub fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32) {
        self.send(Msg::ReplacementRequested { node: node.into(), group: group.into(), from, to });
    }

    /// See [`StatusPublisher::drain_started`].
    pub fn drain_started(&self, node: &str, why: &str) {
        self.send(Msg::DrainStarted { node: node.into(), why: why.into() });
    }

    /// See [`StatusPublisher::pod_evicted`].
    pub fn pod_evicted(&self, pod: &str, node: &str) {
        self.send(Msg::PodEvicted { pod: pod.into(), node: node.into() });
    }

    /// See [`StatusPublisher::eviction_blocked`].
    pub fn eviction_blocked(&self, pod: &str, node: &str, why: &str) {
        self.send(Msg::EvictionBlocked { pod: pod.into(), node: node.into(), why: why.into() });
    }

    /// See [`StatusPublisher::scale_down_failed`].
    pub fn scale_down_failed(&self, node: &str, group: &str, error: &str) {
        self.send(Msg::ScaleDownFailed { node: node.into(), group: group.into(), error: error.into() });
    }

    /// See [`StatusPublisher::preempted`].
    pub fn preempted(&self, victim: &str, node: &str, preemptor: &str, why: &str) {
        self.send(Msg::Preempted {
            victim: victim.into(),
            node: node.into(),
            preemptor: preemptor.into(),
            why: why.into(),
        });
    }

    /// See [`StatusPublisher::node_deleted`].
    pub fn node_deleted(&self, node: &str, group: &str) {
        self.send(Msg::NodeDeleted { node: node.into(), group: group.into() });
    }

    /// See [`StatusPublisher::objects_refused`].
    pub fn objects_refused(&self, refused: &[crate::k8s::RefusedObject]) {
        self.send(Msg::ObjectsRefused(refused.to_vec()));
    }

    /// See [`StatusPublisher::request_condition`].
    pub fn request_condition(
        &self,
        request: &str,
        uid: Option<&str>,
        condition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
    ) {
        self.send(Msg::RequestCondition {
            request: request.into(),
            uid: uid.map(str::to_string),
            condition: Box::new(condition.clone()),
        });
    }

    /// Waits until everything queued before this call is published (tests, shutdown).
    pub async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

/// The data of a group's status ConfigMap.
fn group_data(
    plan: &Plan,
    g: &NodeGroup,
    mem: &GroupMemory,
    counts: Option<[usize; 5]>,
    dry_run: bool,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut d = BTreeMap::new();
    // One line per key: names, reasons and cloud errors escaped as everywhere else.
    let mut put = |k: &str, v: String| {
        d.insert(k.to_string(), shown(&v).into_owned());
    };
    put("group", g.id.clone());
    put("instanceType", g.instance_type.clone());
    put("capacityType", format!("{:?}", g.capacity_type));
    put("targetSize", g.target_size.to_string());
    put("minSize", g.min_size.to_string());
    put("maxSize", g.max_size.to_string());
    if let Some([ready, initializing, upcoming, deleting, unready]) = counts {
        put("readyNodes", ready.to_string());
        put("initializingNodes", initializing.to_string());
        put("upcomingNodes", upcoming.to_string());
        put("deletingNodes", deleting.to_string());
        put("unreadyNodes", unready.to_string());
    }
    for (key, value) in [
        ("lastScaleUp", &mem.last_scale_up),
        ("lastScaleUpFailure", &mem.last_scale_up_failure),
        ("lastScaleDown", &mem.last_scale_down),
    ] {
        if let Some((at, why)) = value {
            put(&format!("{key}Time"), at.to_string());
            put(&format!("{key}Reason"), why.clone());
        }
    }
    match &mem.backoff {
        Some((until, why)) if *until > now => {
            put("backoff", "true".into());
            put("backoffUntil", until.to_string());
            put("backoffReason", why.clone());
        }
        _ => put("backoff", "false".into()),
    }
    put("dryRun", dry_run.to_string());
    put("lastUpdated", now.to_string());
    // Several lines, each escaped on its own.
    d.insert("lastPlan".into(), group_plan_summary(plan, &g.id));
    d
}

/// The lines of `plan` about group `id`.
fn group_plan_summary(plan: &Plan, id: &str) -> String {
    let mut out = String::new();
    for a in plan.scale_ups.iter().filter(|a| a.group == id) {
        let _ = writeln!(
            out,
            "scale-up {} -> {} (+{}) for {} pod(s), +{}: {}",
            a.from,
            a.to,
            a.to.saturating_sub(a.from),
            a.pods.len(),
            usd(a.cost_per_hour),
            shown(&a.reason)
        );
    }
    for a in plan.scale_downs.iter().filter(|a| a.group == id) {
        let _ = writeln!(
            out,
            "scale-down node {}, -{}: {}",
            shown(&a.node),
            usd(a.saving_per_hour),
            shown(&a.reason)
        );
    }
    for a in plan.replacements.iter().filter(|a| a.group == id) {
        let _ = writeln!(
            out,
            "replace node {} by one node of {}, -{}",
            shown(&a.node),
            shown(&a.replacement_group),
            usd(a.saving_per_hour)
        );
    }
    for a in plan.replacements.iter().filter(|a| a.replacement_group == id) {
        let _ = writeln!(out, "add one node to replace node {} of {}", shown(&a.node), shown(&a.group));
    }
    if out.is_empty() {
        out.push_str("no action\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plans handed over faster than they are published replace each other: one turn queued,
    /// the newest plan published, and never a pile of plans (each with its group counts) in the
    /// queue.
    #[test]
    fn plans_not_yet_published_are_replaced_by_the_newest() {
        use crate::planner::Unschedulable;
        let (tx, mut rx) = tokio::sync::mpsc::channel(STATUS_QUEUE);
        let handle = StatusHandle { tx, metrics: None, latest: Arc::default() };
        let groups = [NodeGroup {
            id: "sim/h100".into(),
            account: "sim".into(),
            instance_type: "p5.48xlarge".into(),
            zones: vec![],
            capacity_type: crate::model::CapacityType::OnDemand,
            price: 1,
            min_size: 0,
            max_size: 4,
            target_size: 0,
            instances: vec![],
            template: Default::default(),
        }];
        for i in 0..5 {
            let plan = Plan {
                unschedulable: vec![Unschedulable { pod: format!("ml/p{i}"), reason: "r".into() }],
                ..Default::default()
            };
            handle.begin_loop();
            handle.publish_plan(&plan, &groups, Some(&ClusterSnapshot::default()), false);
        }
        let mut turns = 0;
        while let Ok(msg) = rx.try_recv() {
            turns += usize::from(matches!(msg, Msg::Plan));
        }
        assert_eq!(turns, 1);
        let queued = handle.latest.lock().unwrap().take().expect("the newest plan waits");
        assert_eq!(queued.plan.unschedulable[0].pod, "ml/p4");
        assert_eq!(queued.counts, Some(BTreeMap::from([("sim/h100".to_string(), [0; 5])])));

        // Taken by the task: the next plan queues a turn again.
        handle.publish_plan(&Plan::default(), &groups, None, false);
        assert!(matches!(rx.try_recv(), Ok(Msg::Plan)));
    }

    /// A 5,000-node plan does not fit a ConfigMap: its longest lists are cut until it does, the
    /// actions are kept whole, and what was left out is said.
    #[test]
    fn a_plan_too_large_for_a_configmap_is_cut_and_says_so() {
        use crate::model::DeviceAssignment;
        use crate::planner::{Kept, PendingPlacement};
        let mut plan = Plan::default();
        for i in 0..12_000 {
            plan.placements.push(PendingPlacement {
                pod: format!("team-{}/pending-pod-with-a-long-name-{i}", i % 17),
                node: format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250),
                devices: DeviceAssignment::None,
                node_in_flight: false,
            });
        }
        for i in 0..5_000 {
            plan.kept.push(Kept {
                node: format!("ip-10-1-{}-{}.ec2.internal", i / 250, i % 250),
                reason: "its pods do not all fit on other nodes".into(),
            });
        }
        let (small, untouched) =
            fitted(&Plan { placements: plan.placements[..10].to_vec(), ..Default::default() }, 3);
        assert_eq!((small.placements.len(), untouched), (10, None));
        let (cut, note) = fitted(&plan, 6);
        let bytes = serde_yaml::to_string(&cut).unwrap().len() + cut.to_table().len();
        assert!(bytes <= STATUS_PLAN_BYTES, "{bytes}");
        assert!(cut.placements.len() < 12_000 && !cut.placements.is_empty());
        let note = note.expect("says what was left out");
        assert!(
            note.contains(&format!("placements: {} of 12000 left out", 12_000 - cut.placements.len())),
            "{note}"
        );
        assert_eq!(cut.placements[..], plan.placements[..cut.placements.len()]);
    }

    /// A group's status ConfigMap shows names and reasons from the cluster as the plan table does:
    /// a newline cannot add a line to `lastPlan`, ESC cannot reach a terminal.
    #[test]
    fn status_configmap_values_are_escaped_as_the_table_is() {
        use crate::planner::ScaleDown;
        let evil = "ip-1\nscale-up 0 -> 100\u{1b}[2J";
        let plan = Plan {
            scale_downs: vec![ScaleDown {
                node: evil.into(),
                group: "sim/g".into(),
                instance: None,
                moves: vec![],
                reason: "idle\r\u{202e}".into(),
                saving_per_hour: dollars(1.0),
            }],
            ..Default::default()
        };
        let summary = group_plan_summary(&plan, "sim/g");
        assert_eq!(summary.lines().count(), 1, "{summary}");
        assert!(!summary.contains('\u{1b}') && !summary.contains('\u{202e}'), "{summary:?}");
        assert!(summary.contains(&*shown(evil)) && summary.contains(r"idle\r\u{202e}"), "{summary}");
        assert!(plan.to_table().contains(&*shown(evil)));
        let group = NodeGroup {
            id: "sim/g".into(),
            account: "sim".into(),
            instance_type: "g6.xlarge".into(),
            zones: vec![],
            capacity_type: crate::model::CapacityType::OnDemand,
            price: 1,
            min_size: 0,
            max_size: 3,
            target_size: 1,
            instances: vec![],
            template: Default::default(),
        };
        let mem = GroupMemory {
            last_scale_down: Some((Timestamp::UNIX_EPOCH, format!("removed node {evil}"))),
            ..Default::default()
        };
        let data = group_data(&plan, &group, &mem, None, false, Timestamp::UNIX_EPOCH);
        assert_eq!(data["lastScaleDownReason"], format!("removed node {}", shown(evil)));
        assert_eq!(data["lastPlan"], summary);
    }

    #[test]
    fn configmap_names_are_dns1123_and_unique() {
        assert_eq!(dns1123("GPU_H100.Spot--x/", 63), "gpu-h100-spot-x");
        assert_eq!(dns1123("--a--", 63), "a");
        assert_eq!(dns1123("abcdef", 3), "abc");
        let ids = ["aws/prod/gpu-H100", "aws/prod/gpu", "gcp/p/gpu"];
        assert_eq!(group_configmap_name("aws/prod/gpu-H100", ids), "gpuscale-status-gpu-h100");
        assert_eq!(group_configmap_name("aws/prod/gpu", ids), "gpuscale-status-aws-prod-gpu");
        assert_eq!(group_configmap_name("gcp/p/gpu", ids), "gpuscale-status-gcp-p-gpu");
        assert_eq!(group_configmap_name("///", ["///"]), "gpuscale-status-unnamed");
        assert_eq!(in_mode("gpuscale-status-gpu-h100", true), "gpuscale-dry-run-status-gpu-h100");
        assert_eq!(in_mode(STATUS_CONFIGMAP, true), DRY_RUN_STATUS_CONFIGMAP);
        assert_eq!(in_mode(STATUS_CONFIGMAP, false), STATUS_CONFIGMAP);
    }
}
