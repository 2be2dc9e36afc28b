//! Which registered nodes are capacity: the node lifecycle Cluster Autoscaler reads, judged the
//! same way by `gpuscale plan` and `gpuscale run` ([`judge_nodes`]).
//!
//! - **Starting**: registered less than the registration time ago and not yet Ready with the GPUs
//!   its group's template promises (device plugin, MIG manager, DRA driver still coming up).
//!   Capacity on its way: pending pods wait for it, it is never an empty node to remove.
//! - **Ready**: its supply is what it advertises now, not what the config promised: a
//!   re-partitioned MIG node offers its current instances, a node whose GPUs come through DRA
//!   offers its ResourceSlices.
//! - **Unready**: registered longer ago and NotReady, or Ready while its GPUs regressed (device
//!   plugin restarting, MIG manager re-partitioning, an unhealthy GPU in fresh telemetry). Not
//!   capacity, takes no pending pods; removed only through the drain path, after the unready
//!   time.
//! - **Being deleted**: left alone.

use super::cluster::GroupIndex;
use crate::model::{ClusterSnapshot, GpuMode, GpusHeld, Node, NodeGroup, NodeState, OwnerKind};
use std::collections::HashSet;

/// Whether a registered node offers what its group's template promises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Ready with the GPUs its group promises.
    Ready,
    /// Not yet, and why.
    InFlight(String),
}

/// Compares a node with its group's template (`None`: unmanaged node, judged on its own): what a
/// starting node still lacks. [`judge`] decides what that means for a node past its start.
pub fn classify(node: &Node, template: Option<&Node>) -> Readiness {
    if node.state == NodeState::Initializing {
        return Readiness::InFlight(if node.gpus.is_empty() || template.is_none_or(|t| t.gpus.is_empty()) {
            "not Ready yet".into()
        } else {
            "not Ready, or its GPUs are not advertised yet".into()
        });
    }
    let Some(template) = template else { return Readiness::Ready };
    // GPUs offered through DRA come with the node's ResourceSlices, published by the driver's
    // kubelet plugin after the node turns Ready: until then the node is on its way, not a node
    // without GPUs (planned as such, every DRA pod waiting for it would ask for another).
    if node.dra.devices.len() < template.dra.devices.len() {
        return Readiness::InFlight(format!(
            "publishes {} of the {} DRA devices of its group",
            node.dra.devices.len(),
            template.dra.devices.len()
        ));
    }
    if template.gpus.is_empty() {
        return Readiness::Ready;
    }
    if node.gpus.len() < template.gpus.len() {
        return Readiness::InFlight(format!(
            "advertises {} of the {} GPUs of its instance type",
            node.gpus.len(),
            template.gpus.len()
        ));
    }
    // The MIG manager says the layout it applied is done: a re-partitioned node (by hand, or on
    // gpuscale's own MIG advice) offers the instances it advertises, not the config's layout.
    let mig_final = node.lifecycle.mig_layout_applied;
    for (want, have) in template.gpus.iter().zip(&node.gpus) {
        match (&want.mode, &have.mode) {
            (GpuMode::TimeSliced { replicas: w }, GpuMode::TimeSliced { replicas: h }) if h >= w => {}
            (GpuMode::TimeSliced { replicas }, _) => {
                return Readiness::InFlight(format!(
                    "GPU {} does not advertise its {replicas} time-sliced replicas yet",
                    have.index
                ))
            }
            (GpuMode::Mig { instances: w, dynamic: false }, GpuMode::Mig { instances: h, .. })
                if h.len() < w.len() && !mig_final =>
            {
                return Readiness::InFlight(format!(
                    "GPU {} advertises {} of its {} MIG instances",
                    have.index,
                    h.len(),
                    w.len()
                ))
            }
            (GpuMode::Mig { .. }, GpuMode::Mig { .. }) => {}
            (GpuMode::Mig { .. }, _) if !mig_final => {
                return Readiness::InFlight(format!("GPU {} does not advertise MIG profiles yet", have.index))
            }
            _ => {}
        }
    }
    Readiness::Ready
}

/// The times the lifecycle is judged with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LifecycleSettings {
    /// Now, seconds since the epoch (`None`: unknown, every node of unknown age is judged by
    /// whether it runs pods).
    pub now: Option<i64>,
    /// A node registered longer ago than this is no longer starting (Cluster Autoscaler's
    /// `max-node-provision-time`, the controller's `registrationTimeoutSeconds`).
    pub registration_timeout_seconds: f64,
    /// Telemetry older than this says nothing (the `telemetry.maxAge` setting).
    pub telemetry_max_age: u64,
}

impl Default for LifecycleSettings {
    fn default() -> Self {
        Self {
            now: None,
            registration_timeout_seconds: super::decide::DecideSettings::default()
                .registration_timeout_seconds,
            telemetry_max_age: crate::model::TelemetrySettings::default().max_age,
        }
    }
}

/// A node that is not Ready capacity, its state ([`NodeState::Initializing`] for starting,
/// [`NodeState::Unready`]) and why, for the plan's warnings and the controller's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Node name.
    pub node: String,
    /// Starting or unready.
    pub state: NodeState,
    /// Why, in words.
    pub why: String,
}

impl Verdict {
    /// The line `gpuscale plan` prints.
    pub fn describe(&self) -> String {
        match self.state {
            NodeState::Unready => {
                format!(
                    "Node {}: unready ({}); not capacity, no pending pod is planned onto it",
                    self.node, self.why
                )
            }
            NodeState::Deleting => format!("Node {}: being deleted ({}); not capacity", self.node, self.why),
            _ => format!("Node {}: starting ({}); counted as capacity on its way", self.node, self.why),
        }
    }
}

/// Judges one node ([`NodeState::Ready`] or [`NodeState::Initializing`] as converted) against its
/// group's template: the state it is in and why. `runs_pods`: pods other than DaemonSet and mirror
/// pods are bound to it, evidence that it has been Ready when its age is unknown.
pub fn judge(
    node: &Node,
    template: Option<&Node>,
    runs_pods: bool,
    settings: &LifecycleSettings,
) -> (NodeState, Option<String>) {
    let life = &node.lifecycle;
    let starting = match (settings.now, life.created_at) {
        (Some(now), Some(created)) => ((now - created) as f64) < settings.registration_timeout_seconds,
        // A snapshot without times: a node running pods has been Ready before.
        _ => !runs_pods,
    };
    // Times as dates, not ages: two plans of one cluster a second apart say the same.
    let age = || match life.created_at {
        Some(created) => format!("registered {}", utc(created)),
        None => "registration time unknown".into(),
    };
    let unready = |why: String| (NodeState::Unready, Some(why));
    let in_flight = |why: String| (NodeState::Initializing, Some(why));
    if life.not_ready || (node.state == NodeState::Initializing && life.gpus_held.is_none()) {
        return if starting {
            in_flight(format!("not Ready yet, {}", age()))
        } else {
            let since = life.ready_changed_at.map_or(String::new(), |t| format!(" since {}", utc(t)));
            unready(format!("NotReady{since}, {}", age()))
        };
    }
    match life.gpus_held {
        Some(GpusHeld::MigReconfiguring) if starting => {
            return in_flight(format!("the MIG manager is applying its layout, {}", age()))
        }
        Some(GpusHeld::MigReconfiguring) => {
            return unready(
                "the MIG manager is re-partitioning its GPUs (nvidia.com/mig.config.state)".into(),
            )
        }
        // GPUs that come through DRA only: its ResourceSlices are its GPUs.
        Some(GpusHeld::DevicePlugin) if life.device_plugin_disabled => {}
        Some(GpusHeld::DevicePlugin) if starting => {
            return in_flight(format!("its device plugin advertises no GPUs yet, {}", age()))
        }
        Some(GpusHeld::DevicePlugin) => {
            return unready("Ready, but its device plugin advertises no GPUs".into())
        }
        None => {}
    }
    if let Some(t) = &node.telemetry {
        let fresh = settings.now.is_some_and(|now| t.is_fresh(now.max(0) as u64, settings.telemetry_max_age));
        if let Some(g) = t.gpus.iter().find(|g| !g.healthy).filter(|_| fresh) {
            return unready(format!(
                "GPU {} ({}) is unhealthy in the agent's telemetry ({} uncorrected ECC errors)",
                g.index, g.uuid, g.ecc_errors
            ));
        }
    }
    if starting && !life.device_plugin_disabled {
        if let Readiness::InFlight(why) = classify(node, template) {
            return in_flight(format!("{why}, {}", age()));
        }
    }
    (NodeState::Ready, None)
}

/// Judges every registered node of `snapshot` ([`judge`]) and sets its state: starting nodes
/// [`NodeState::Initializing`], unready ones [`NodeState::Unready`] (with `unready_since` from
/// the Ready condition where it says), Ready ones [`NodeState::Ready`] with what they advertise (a
/// node whose GPUs come through DRA loses the device-plugin GPUs its labels implied). Returns the
/// nodes that are not Ready capacity, with why. `gpuscale plan`, `gpuscale run` and the replays
/// all judge through here.
pub fn judge_nodes(
    snapshot: &mut ClusterSnapshot,
    groups: &[NodeGroup],
    settings: &LifecycleSettings,
) -> Vec<Verdict> {
    let running: HashSet<&str> = snapshot
        .workloads
        .iter()
        .filter(|w| !matches!(w.owner, OwnerKind::DaemonSet | OwnerKind::Node))
        .filter_map(|w| w.node_name.as_deref())
        .collect();
    let index = GroupIndex::of(groups);
    let mut verdicts = Vec::new();
    let mut judged = Vec::with_capacity(snapshot.nodes.len());
    for node in &snapshot.nodes {
        if node.state == NodeState::Deleting {
            let on = |w: &&crate::model::Workload| w.node_name.as_deref() == Some(node.name.as_str());
            let pods = snapshot.workloads.iter().filter(on).count();
            let why = format!("deletionTimestamp or a deletion taint; {pods} pod(s) on it");
            verdicts.push(Verdict { node: node.name.clone(), state: NodeState::Deleting, why });
        }
        if !matches!(node.state, NodeState::Ready | NodeState::Initializing) {
            judged.push(None);
            continue;
        }
        let template = index.group_of(node).map(|g| &groups[g].template);
        judged.push(Some(judge(node, template, running.contains(node.name.as_str()), settings)));
    }
    for (node, judged) in snapshot.nodes.iter_mut().zip(judged) {
        let Some((state, why)) = judged else { continue };
        if state != NodeState::Initializing && node.lifecycle.gpus_held == Some(GpusHeld::DevicePlugin) {
            // The GPUs its labels promised are not advertised: Ready through DRA, or unready.
            node.gpus.clear();
        }
        if state == NodeState::Unready && node.lifecycle.not_ready {
            node.lifecycle.unready_since = node.lifecycle.ready_changed_at.or(node.lifecycle.unready_since);
        }
        node.state = state;
        if let Some(why) = why {
            verdicts.push(Verdict { node: node.name.clone(), state, why });
        }
    }
    verdicts
}

/// Seconds since the epoch as an RFC 3339 UTC time (the civil-from-days algorithm of Howard
/// Hinnant's date library; the pure core has no date crate).
pub fn utc(t: i64) -> String {
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDevice, GpuSample, Instance, InstanceState, MigInstance, NodeTelemetry, Workload};

    const NOW: i64 = 1_700_000_000;

    fn settings() -> LifecycleSettings {
        LifecycleSettings { now: Some(NOW), registration_timeout_seconds: 900.0, telemetry_max_age: 600 }
    }

    fn a100(mig: Option<usize>) -> Node {
        let geometry = crate::model::GpuCatalog.resolve("A100-SXM4-80GB").and_then(|m| m.mig).unwrap();
        let layout = geometry.maximal_layouts().into_iter().max_by_key(Vec::len).unwrap();
        let mode = match mig {
            Some(k) => GpuMode::Mig {
                instances: layout
                    .iter()
                    .take(k)
                    .map(|p| MigInstance { placement: p.clone(), used: false })
                    .collect(),
                dynamic: false,
            },
            None => GpuMode::Standard,
        };
        Node {
            name: "n".into(),
            gpus: (0..8).map(|i| GpuDevice { mode: mode.clone(), ..GpuDevice::standard(i, 81920) }).collect(),
            gpu_model: Some("A100-SXM4-80GB".into()),
            provider_id: Some("i-1".into()),
            ..Default::default()
        }
    }

    fn snapshot_of(node: Node, template: Node) -> (ClusterSnapshot, Vec<NodeGroup>) {
        let group = NodeGroup {
            id: "aws/prod/a100".into(),
            account: "prod".into(),
            instance_type: "p4d.24xlarge".into(),
            zones: vec![],
            capacity_type: Default::default(),
            price: 1,
            min_size: 0,
            max_size: 4,
            target_size: 1,
            instances: vec![Instance { id: "i-1".into(), state: InstanceState::Running }],
            template,
        };
        (ClusterSnapshot { nodes: vec![node], ..Default::default() }, vec![group])
    }

    fn judged(node: Node, template: Node) -> (Node, Vec<Verdict>) {
        let (mut snapshot, groups) = snapshot_of(node, template);
        let verdicts = judge_nodes(&mut snapshot, &groups, &settings());
        (snapshot.nodes.remove(0), verdicts)
    }

    fn aged(mut node: Node, age: i64) -> Node {
        node.lifecycle.created_at = Some(NOW - age);
        node
    }

    #[test]
    fn utc_times_read_as_kubectl_prints_them() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_740_816_000), "2025-03-01T08:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn a_ready_node_offers_what_it_advertises_once_started() {
        // All-1g template (7 instances per GPU); the node was re-partitioned to 3 instances.
        let template = a100(Some(7));
        let (n, v) = judged(aged(a100(Some(3)), 86_400), template.clone());
        assert_eq!((n.state, v), (NodeState::Ready, vec![]));
        // Two minutes after registering it is still coming up.
        let (n, v) = judged(aged(a100(Some(3)), 120), template.clone());
        assert_eq!(n.state, NodeState::Initializing);
        assert!(
            v[0].why.contains("MIG instances") && v[0].why.contains("registered 2023-11-14T22:11:20Z"),
            "{v:?}"
        );
        // Unless the MIG manager says the layout it applied is done: then it is the node's.
        let mut applied = aged(a100(Some(3)), 120);
        applied.lifecycle.mig_layout_applied = true;
        assert_eq!(judged(applied, template.clone()).0.state, NodeState::Ready);
        // Without a creation time: a node running pods has been Ready before.
        let (mut snapshot, groups) = snapshot_of(a100(Some(3)), template.clone());
        snapshot.workloads.push(Workload {
            id: "ml/p".into(),
            node_name: Some("n".into()),
            ..Default::default()
        });
        judge_nodes(&mut snapshot, &groups, &settings());
        assert_eq!(snapshot.nodes[0].state, NodeState::Ready);
        let (n, _) = judged(a100(Some(3)), template);
        assert_eq!(n.state, NodeState::Initializing, "no pods, no age: still starting");
    }

    #[test]
    fn not_ready_is_starting_when_young_and_unready_after_the_registration_time() {
        let mut young = aged(a100(None), 120);
        young.state = NodeState::Initializing;
        young.lifecycle.not_ready = true;
        let (n, v) = judged(young, a100(None));
        assert_eq!(n.state, NodeState::Initializing);
        assert!(v[0].describe().contains("starting (not Ready yet"), "{v:?}");
        let mut old = aged(a100(None), 30 * 86_400);
        old.state = NodeState::Initializing;
        old.lifecycle.not_ready = true;
        old.lifecycle.ready_changed_at = Some(NOW - 29 * 86_400);
        let (n, v) = judged(old, a100(None));
        assert_eq!((n.state, n.lifecycle.unready_since), (NodeState::Unready, Some(NOW - 29 * 86_400)));
        assert!(v[0].describe().contains("unready (NotReady since 2023-10-16T22:13:20Z"), "{v:?}");
    }

    #[test]
    fn gpu_regressions_make_a_started_node_unready_and_take_its_promised_gpus() {
        for (held, words) in [
            (GpusHeld::DevicePlugin, "device plugin advertises no GPUs"),
            (GpusHeld::MigReconfiguring, "MIG manager is re-partitioning"),
        ] {
            let mut n = aged(a100(None), 86_400);
            n.state = NodeState::Initializing;
            n.lifecycle.gpus_held = Some(held);
            let (n, v) = judged(n, a100(None));
            assert_eq!(n.state, NodeState::Unready);
            assert!(v[0].why.contains(words), "{v:?}");
            if held == GpusHeld::DevicePlugin {
                assert!(n.gpus.is_empty(), "GPUs nobody advertises are no supply");
            }
        }
    }

    #[test]
    fn a_node_whose_device_plugin_is_off_is_ready_dra_capacity() {
        let mut n = aged(a100(None), 86_400);
        n.state = NodeState::Initializing;
        n.lifecycle.gpus_held = Some(GpusHeld::DevicePlugin);
        n.lifecycle.device_plugin_disabled = true;
        let (n, v) = judged(n, a100(None));
        assert_eq!((n.state, n.gpus.len(), v), (NodeState::Ready, 0, vec![]));
    }

    #[test]
    fn only_fresh_telemetry_of_an_unhealthy_gpu_makes_a_node_unready() {
        let sample = |sampled_at: i64| NodeTelemetry {
            sampled_at: sampled_at as u64,
            gpus: vec![GpuSample {
                index: 3,
                uuid: "GPU-3".into(),
                model: "A100-SXM4-80GB".into(),
                utilization_pct: Some(0),
                memory_used_bytes: 0,
                memory_total_bytes: 1,
                ecc_errors: 2,
                healthy: false,
                mig: vec![],
                idle_since: None,
            }],
        };
        let mut n = aged(a100(None), 86_400);
        n.telemetry = Some(sample(NOW - 30));
        let (judged_fresh, v) = judged(n.clone(), a100(None));
        assert_eq!(judged_fresh.state, NodeState::Unready);
        assert!(v[0].why.contains("GPU 3 (GPU-3) is unhealthy"), "{v:?}");
        n.telemetry = Some(sample(NOW - 3600));
        assert_eq!(judged(n, a100(None)).0.state, NodeState::Ready, "a stale sample says nothing");
    }
}
