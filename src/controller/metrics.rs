//! Prometheus metrics of the controller (`/metrics`, OpenMetrics text), all prefixed `gpuscale_`.
//!
//! What is pending and why, how many nodes each group has in each state, what the last plan costs,
//! how long a loop takes, and counters of the actions and errors, so that dashboards and alerts do
//! not need to parse logs. Gauges that describe the last snapshot are reset on every
//! [`Metrics::observe_plan`], so that groups, profiles and states that disappeared stop being
//! reported.

use crate::model::{dollars, ClusterSnapshot, GpuDemand, NodeGroup, NodeState};
use crate::planner::Plan;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

type Labels1 = [(&'static str, String); 1];
type Labels2 = [(&'static str, String); 2];
type FloatGauge = Gauge<f64, AtomicU64>;

/// The controller's metrics and the registry that encodes them. Cheap to share behind an `Arc`;
/// every method takes `&self`.
pub struct Metrics {
    registry: Registry,
    pending_pods: Family<Labels1, Gauge>,
    pending_whole_gpus: Gauge,
    pending_gpu_milli: Gauge,
    pending_mig_instances: Family<Labels1, Gauge>,
    pending_shared_replicas: Gauge,
    unschedulable_pods: Gauge,
    nodes: Family<Labels2, Gauge>,
    group_size: Family<Labels2, Gauge>,
    planned_actions: Family<Labels1, Gauge>,
    plan_cost: Family<Labels1, FloatGauge>,
    provisioning_requests: Family<Labels1, Gauge>,
    loop_duration: Histogram,
    scale_ups: Family<Labels1, Counter>,
    scaled_up_nodes: Family<Labels1, Counter>,
    scale_downs: Family<Labels1, Counter>,
    errors: Family<Labels1, Counter>,
    backoffs: Family<Labels1, Counter>,
    refused_objects: Family<Labels1, Gauge>,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Label value of a node state.
fn state_label(state: NodeState) -> &'static str {
    match state {
        NodeState::Ready => "ready",
        NodeState::Initializing => "initializing",
        NodeState::Upcoming => "upcoming",
        NodeState::Deleting => "deleting",
        NodeState::Unready => "unready",
    }
}

/// Label value of a demand kind.
fn kind_label(demand: &GpuDemand) -> &'static str {
    match demand {
        GpuDemand::None => "none",
        GpuDemand::Whole { .. } => "whole",
        GpuDemand::Fraction { .. } => "fraction",
        GpuDemand::Mig { .. } => "mig",
        GpuDemand::Shared { .. } => "shared",
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Registers every metric under the `gpuscale_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpuscale");
        let m = Metrics {
            pending_pods: Family::default(),
            pending_whole_gpus: Gauge::default(),
            pending_gpu_milli: Gauge::default(),
            pending_mig_instances: Family::default(),
            pending_shared_replicas: Gauge::default(),
            unschedulable_pods: Gauge::default(),
            nodes: Family::default(),
            group_size: Family::default(),
            planned_actions: Family::default(),
            plan_cost: Family::default(),
            provisioning_requests: Family::default(),
            loop_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            scale_ups: Family::default(),
            scaled_up_nodes: Family::default(),
            scale_downs: Family::default(),
            errors: Family::default(),
            backoffs: Family::default(),
            refused_objects: Family::default(),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "refused_objects",
            "Objects left out of the last pass because a value in them is past a bound of gpuscale's \
             limits (each has a Warning Event naming the field), by kind",
            m.refused_objects.clone(),
        );
        r.register(
            "pending_pods",
            "Pending pods in the last snapshot, by GPU demand kind (none, whole, fraction, mig, shared)",
            m.pending_pods.clone(),
        );
        r.register(
            "pending_whole_gpus",
            "Whole GPUs (nvidia.com/gpu) asked by pending pods",
            m.pending_whole_gpus.clone(),
        );
        r.register(
            "pending_gpu_milli",
            "GPU shares asked by pending pods, in thousandths of a GPU (count x milli)",
            m.pending_gpu_milli.clone(),
        );
        r.register(
            "pending_mig_instances",
            "MIG instances asked by pending pods, by profile",
            m.pending_mig_instances.clone(),
        );
        r.register(
            "pending_shared_replicas",
            "Time-sliced GPU replicas asked by pending pods",
            m.pending_shared_replicas.clone(),
        );
        r.register(
            "unschedulable_pods",
            "Pending pods that no existing, in-flight or new node can serve",
            m.unschedulable_pods.clone(),
        );
        r.register(
            "nodes",
            "Nodes by node group (node-group label) and state (ready, initializing, upcoming, deleting)",
            m.nodes.clone(),
        );
        r.register(
            "node_group_size",
            "Node group sizes by group id and bound (target, min, max)",
            m.group_size.clone(),
        );
        r.register(
            "planned_actions",
            "Actions in the last plan, by action (scale_up, scale_down, replace, placement)",
            m.planned_actions.clone(),
        );
        r.register(
            "plan_cost_dollars_per_hour",
            "Cost of the node groups before and after the last plan (when=before|after)",
            m.plan_cost.clone(),
        );
        r.register_with_unit(
            "loop_duration",
            "Duration of one control loop (snapshot, plan, act)",
            Unit::Seconds,
            m.loop_duration.clone(),
        );
        r.register(
            "provisioning_requests",
            "ProvisioningRequests in the last plan, by state (provisioned, booked, provisioning, scalingUp, notFound, failed, bookingExpired, ignored)",
            m.provisioning_requests.clone(),
        );
        r.register("scale_ups", "Scale-ups requested from the cloud, by group", m.scale_ups.clone());
        r.register(
            "scaled_up_nodes",
            "Nodes added to groups by scale-ups, by group",
            m.scaled_up_nodes.clone(),
        );
        r.register("scale_downs", "Nodes removed from groups, by group", m.scale_downs.clone());
        r.register("errors", "Errors, by kind", m.errors.clone());
        r.register(
            "backoffs",
            "Times a group was put in backoff after a failed scale-up",
            m.backoffs.clone(),
        );
        r.register("leader", "1 when this replica holds the leader lease", m.leader.clone());
        Metrics { registry, ..m }
    }

    /// Records what a loop saw and decided: pending demand and node states of `snapshot`, the
    /// actions and cost of `plan`, and the loop's duration.
    pub fn observe_plan(&self, plan: &Plan, snapshot: &ClusterSnapshot, elapsed: Duration) {
        self.loop_duration.observe(elapsed.as_secs_f64());

        let mut pods: BTreeMap<&'static str, i64> = BTreeMap::new();
        let (mut whole, mut milli, mut shared) = (0u64, 0u64, 0u64);
        let mut mig: BTreeMap<String, u64> = BTreeMap::new();
        for w in snapshot.pending() {
            *pods.entry(kind_label(&w.gpu)).or_default() += 1;
            match &w.gpu {
                GpuDemand::None => {}
                GpuDemand::Whole { count } => whole += u64::from(*count),
                GpuDemand::Fraction { count, milli: m, .. } => milli += u64::from(*count) * u64::from(*m),
                GpuDemand::Mig { profile, count } => {
                    *mig.entry(profile.clone()).or_default() += u64::from(*count)
                }
                GpuDemand::Shared { count } => shared += u64::from(*count),
            }
        }
        self.pending_pods.clear();
        for kind in ["none", "whole", "fraction", "mig", "shared"] {
            self.pending_pods
                .get_or_create(&[("kind", kind.into())])
                .set(pods.get(kind).copied().unwrap_or(0));
        }
        self.pending_whole_gpus.set(i64_of(whole));
        self.pending_gpu_milli.set(i64_of(milli));
        self.pending_shared_replicas.set(i64_of(shared));
        self.pending_mig_instances.clear();
        for (profile, n) in mig {
            self.pending_mig_instances.get_or_create(&[("profile", profile)]).set(i64_of(n));
        }
        self.unschedulable_pods.set(plan.unschedulable.len() as i64);

        let mut nodes: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
        for n in &snapshot.nodes {
            let group = n.node_group.clone().unwrap_or_default();
            for state in [
                NodeState::Ready,
                NodeState::Initializing,
                NodeState::Upcoming,
                NodeState::Deleting,
                NodeState::Unready,
            ] {
                nodes.entry((group.clone(), state_label(state))).or_default();
            }
            *nodes.entry((group, state_label(n.state))).or_default() += 1;
        }
        self.nodes.clear();
        for ((group, state), n) in nodes {
            self.nodes.get_or_create(&[("group", group), ("state", state.into())]).set(n);
        }

        for (action, n) in [
            ("scale_up", plan.scale_ups.len()),
            ("scale_down", plan.scale_downs.len()),
            ("replace", plan.replacements.len()),
            ("placement", plan.placements.len()),
        ] {
            self.planned_actions.get_or_create(&[("action", action.into())]).set(n as i64);
        }
        for state in crate::planner::RequestState::ALL {
            let n = plan.provisioning_requests.iter().filter(|r| r.state == state).count();
            self.provisioning_requests.get_or_create(&[("state", state.name())]).set(n as i64);
        }
        let per_dollar = dollars(1.0) as f64;
        self.plan_cost.get_or_create(&[("when", "before".into())]).set(plan.cost_before as f64 / per_dollar);
        self.plan_cost.get_or_create(&[("when", "after".into())]).set(plan.cost_after as f64 / per_dollar);
    }

    /// Records the node groups' target, min and max sizes (after each provider refresh); groups
    /// no longer configured stop being reported.
    pub fn observe_groups(&self, groups: &[NodeGroup]) {
        self.group_size.clear();
        for g in groups {
            for (bound, v) in [("target", g.target_size), ("min", g.min_size), ("max", g.max_size)] {
                self.group_size
                    .get_or_create(&[("group", g.id.clone()), ("bound", bound.into())])
                    .set(v.into());
            }
        }
    }

    /// Counts a scale-up of `group` by `by` nodes that the cloud accepted.
    pub fn scaled_up(&self, group: &str, by: u32) {
        let l = [("group", group.to_string())];
        self.scale_ups.get_or_create(&l).inc();
        self.scaled_up_nodes.get_or_create(&l).inc_by(u64::from(by));
    }

    /// Counts one node of `group` removed.
    pub fn scaled_down(&self, group: &str) {
        self.scale_downs.get_or_create(&[("group", group.to_string())]).inc();
    }

    /// Counts an error of `kind` (e.g. `cloud`, `kube`, `eviction`, `status`).
    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&[("kind", kind.to_string())]).inc();
    }

    /// Sets the objects refused in the last pass, by kind (kinds with none left are cleared).
    pub fn observe_refused(&self, refused: &[crate::k8s::RefusedObject]) {
        self.refused_objects.clear();
        for r in refused {
            self.refused_objects.get_or_create(&[("kind", r.kind.clone())]).inc();
        }
    }

    /// Counts `group` entering backoff.
    pub fn backoff(&self, group: &str) {
        self.backoffs.get_or_create(&[("group", group.to_string())]).inc();
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The metrics in OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; encoders only propagate the writer's errors.
        encode(&mut out, &self.registry).expect("encoding metrics into a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Node, Workload};
    use crate::planner::{ScaleUp, Unschedulable};

    fn pending(id: &str, gpu: GpuDemand) -> Workload {
        Workload { id: id.into(), gpu, ..Default::default() }
    }

    fn node(name: &str, group: &str, state: NodeState) -> Node {
        Node { name: name.into(), node_group: Some(group.into()), state, ..Default::default() }
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .map(|v| v.trim().parse().expect("a number"))
    }

    #[test]
    fn observe_plan_reports_pending_demand_nodes_and_cost() {
        let m = Metrics::new();
        let mut running = pending("ns/running", GpuDemand::Whole { count: 8 });
        running.node_name = Some("a".into());
        let snapshot = ClusterSnapshot {
            nodes: vec![
                node("a", "h100", NodeState::Ready),
                node("b", "h100", NodeState::Initializing),
                node("c", "h100", NodeState::Ready),
                node("d", "a100-mig", NodeState::Upcoming),
            ],
            workloads: vec![
                running,
                pending("ns/w1", GpuDemand::Whole { count: 2 }),
                pending("ns/w2", GpuDemand::Whole { count: 1 }),
                pending("ns/f", GpuDemand::Fraction { count: 2, milli: 250, memory_mib: 0 }),
                pending("ns/m1", GpuDemand::Mig { profile: "3g.20gb".into(), count: 2 }),
                pending("ns/m2", GpuDemand::Mig { profile: "1g.5gb".into(), count: 1 }),
                pending("ns/s", GpuDemand::Shared { count: 3 }),
                pending("ns/cpu", GpuDemand::None),
            ],
            disruption_budgets: vec![],
            provisioning_requests: vec![],
        };
        let plan = Plan {
            scale_ups: vec![ScaleUp {
                group: "aws/prod/h100".into(),
                instance_type: "p5.48xlarge".into(),
                from: 2,
                to: 3,
                pods: vec!["ns/w1".into()],
                requests: vec![],
                reason: "cheapest".into(),
                cost_per_hour: dollars(98.32),
            }],
            unschedulable: vec![Unschedulable { pod: "ns/s".into(), reason: "no group".into() }],
            provisioning_requests: vec![crate::planner::RequestOutcome {
                request: "ml/train-prov-1".into(),
                class: crate::model::provisioning::ATOMIC_SCALE_UP_CLASS.into(),
                pods: 4,
                state: crate::planner::RequestState::ScalingUp,
                reason: "CapacityIsBeingProvisioned".into(),
                message: String::new(),
                nodes: vec![],
                groups: vec!["aws/prod/h100 +4".into()],
            }],
            cost_before: dollars(196.64),
            cost_after: dollars(294.96),
            ..Default::default()
        };
        m.observe_plan(&plan, &snapshot, Duration::from_millis(1500));
        m.set_leader(true);
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF:\n{text}");
        assert!(text.contains("# TYPE gpuscale_loop_duration_seconds histogram"), "{text}");
        assert_eq!(sample(&text, "gpuscale_pending_whole_gpus"), Some(3.0));
        assert_eq!(sample(&text, "gpuscale_pending_gpu_milli"), Some(500.0));
        assert_eq!(sample(&text, "gpuscale_pending_shared_replicas"), Some(3.0));
        assert_eq!(sample(&text, "gpuscale_pending_mig_instances{profile=\"3g.20gb\"}"), Some(2.0));
        assert_eq!(sample(&text, "gpuscale_pending_mig_instances{profile=\"1g.5gb\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_pending_pods{kind=\"whole\"}"), Some(2.0));
        assert_eq!(sample(&text, "gpuscale_pending_pods{kind=\"none\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_unschedulable_pods"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_nodes{group=\"h100\",state=\"ready\"}"), Some(2.0));
        assert_eq!(sample(&text, "gpuscale_nodes{group=\"h100\",state=\"initializing\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_nodes{group=\"h100\",state=\"deleting\"}"), Some(0.0));
        assert_eq!(sample(&text, "gpuscale_nodes{group=\"a100-mig\",state=\"upcoming\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_planned_actions{action=\"scale_up\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_provisioning_requests{state=\"scalingUp\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_provisioning_requests{state=\"booked\"}"), Some(0.0));
        assert_eq!(sample(&text, "gpuscale_plan_cost_dollars_per_hour{when=\"before\"}"), Some(196.64));
        assert_eq!(sample(&text, "gpuscale_plan_cost_dollars_per_hour{when=\"after\"}"), Some(294.96));
        assert_eq!(sample(&text, "gpuscale_loop_duration_seconds_count"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_loop_duration_seconds_sum"), Some(1.5));
        assert_eq!(sample(&text, "gpuscale_loop_duration_seconds_bucket{le=\"1.28\"}"), Some(0.0));
        assert_eq!(sample(&text, "gpuscale_loop_duration_seconds_bucket{le=\"2.56\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_leader"), Some(1.0));

        // The next loop forgets what is gone.
        m.observe_plan(&Plan::default(), &ClusterSnapshot::default(), Duration::from_millis(10));
        let text = m.encode();
        assert_eq!(sample(&text, "gpuscale_pending_mig_instances{profile=\"3g.20gb\"}"), None);
        assert_eq!(sample(&text, "gpuscale_nodes{group=\"h100\",state=\"ready\"}"), None);
        assert_eq!(sample(&text, "gpuscale_provisioning_requests{state=\"scalingUp\"}"), Some(0.0));
        assert_eq!(sample(&text, "gpuscale_pending_whole_gpus"), Some(0.0));
        assert_eq!(sample(&text, "gpuscale_loop_duration_seconds_count"), Some(2.0));
    }

    #[test]
    fn counters_count_per_group_and_kind() {
        let m = Metrics::new();
        m.scaled_up("aws/prod/h100", 3);
        m.scaled_up("aws/prod/h100", 2);
        m.scaled_down("aws/prod/h100");
        m.error("cloud");
        m.error("cloud");
        m.error("eviction");
        m.backoff("gcp/p/l4");
        m.set_leader(false);
        let mut g = NodeGroup {
            id: "aws/prod/h100".into(),
            account: "prod".into(),
            instance_type: "p5.48xlarge".into(),
            zones: vec![],
            capacity_type: Default::default(),
            price: 0,
            min_size: 1,
            max_size: 8,
            target_size: 3,
            instances: vec![],
            template: Node::default(),
        };
        m.observe_groups(std::slice::from_ref(&g));
        g.id = "gcp/p/l4".into();
        m.observe_groups(&[g]);
        let text = m.encode();
        assert_eq!(sample(&text, "gpuscale_node_group_size{group=\"gcp/p/l4\",bound=\"target\"}"), Some(3.0));
        assert_eq!(sample(&text, "gpuscale_node_group_size{group=\"gcp/p/l4\",bound=\"max\"}"), Some(8.0));
        assert_eq!(sample(&text, "gpuscale_node_group_size{group=\"aws/prod/h100\",bound=\"min\"}"), None);
        assert!(text.contains("# TYPE gpuscale_scale_ups counter"), "{text}");
        assert_eq!(sample(&text, "gpuscale_scale_ups_total{group=\"aws/prod/h100\"}"), Some(2.0));
        assert_eq!(sample(&text, "gpuscale_scaled_up_nodes_total{group=\"aws/prod/h100\"}"), Some(5.0));
        assert_eq!(sample(&text, "gpuscale_scale_downs_total{group=\"aws/prod/h100\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_errors_total{kind=\"cloud\"}"), Some(2.0));
        assert_eq!(sample(&text, "gpuscale_errors_total{kind=\"eviction\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_backoffs_total{group=\"gcp/p/l4\"}"), Some(1.0));
        assert_eq!(sample(&text, "gpuscale_leader"), Some(0.0));
    }
}
