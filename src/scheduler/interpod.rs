//! The filters that look beyond one node: kube-scheduler's InterPodAffinity (required affinity,
//! required anti-affinity, and the anti-affinity of pods already running) and PodTopologySpread
//! (`DoNotSchedule`), with the semantics of `pkg/scheduler/framework/plugins/interpodaffinity`
//! and `podtopologyspread` (Kubernetes 1.35): counts per topology pair over every node, then a
//! verdict per node.

use super::fit::Unfit;
use crate::model::{Node, PodIdentity, Workload};
use std::collections::BTreeMap;

/// Whether `w` needs these filters at all: it has terms or spread constraints, or some pod in the
/// cluster has anti-affinity (`anti_holders` counts them).
pub fn applies(w: &Workload, anti_holders: usize) -> bool {
    !w.pod_affinity.is_empty()
        || !w.pod_anti_affinity().is_empty()
        || !w.spread.is_empty()
        || anti_holders > 0
}

type Pair<'a> = (&'a str, &'a str);

/// The verdict per node, or `None` when nothing constrains `w`.
pub fn verdicts(nodes: &[Node], w: &Workload, anti_holders: usize) -> Option<Vec<Result<(), Unfit>>> {
    if !applies(w, anti_holders) {
        return None;
    }
    let fallback = PodIdentity::default();
    let me = w.identity.as_deref().unwrap_or(&fallback);
    let ns = me.namespace.as_str();

    // Counts per topology pair, as the plugins' PreFilter computes them.
    let mut affinity: BTreeMap<Pair, u32> = BTreeMap::new();
    let mut anti: BTreeMap<Pair, u32> = BTreeMap::new();
    let mut existing_anti: BTreeMap<Pair, u32> = BTreeMap::new();
    for node in nodes {
        for r in &node.residents {
            for t in &w.pod_affinity {
                if let Some(v) = node.labels.get(&t.topology_key) {
                    if t.selects(&r.namespace, &r.labels) {
                        *affinity.entry((t.topology_key.as_str(), v.as_str())).or_default() += 1;
                    }
                }
            }
            for t in w.pod_anti_affinity() {
                if let Some(v) = node.labels.get(&t.topology_key) {
                    if t.selects(&r.namespace, &r.labels) {
                        *anti.entry((t.topology_key.as_str(), v.as_str())).or_default() += 1;
                    }
                }
            }
            for t in &r.anti_affinity {
                if let Some(v) = node.labels.get(&t.topology_key) {
                    if t.selects(ns, &me.labels) {
                        *existing_anti.entry((t.topology_key.as_str(), v.as_str())).or_default() += 1;
                    }
                }
            }
        }
    }
    // The first pod of a group with affinity to itself may go anywhere its topology exists.
    let self_affine = affinity.is_empty() && w.pod_affinity.iter().all(|t| t.selects(ns, &me.labels));

    // Spread: domains are the nodes the pod's node affinity (and, when honoured, taints) admit
    // that carry every constraint's key.
    let keys: Vec<&str> = w.spread.iter().map(|c| c.topology_key.as_str()).collect();
    let has_keys = |n: &Node| keys.iter().all(|k| n.labels.contains_key(*k));
    let mut spread_counts: Vec<BTreeMap<&str, u32>> = vec![BTreeMap::new(); w.spread.len()];
    for node in nodes.iter().filter(|n| has_keys(n)) {
        for (ci, c) in w.spread.iter().enumerate() {
            let affinity_ok = !c.honor_node_affinity || w.allowed_by_node_affinity(node);
            let taints_ok = !c.honor_node_taints || w.tolerates_taints_of(node);
            if !(affinity_ok && taints_ok) {
                continue;
            }
            let v = node.labels[&c.topology_key].as_str();
            let matching =
                node.residents.iter().filter(|r| r.namespace == ns && c.selector.matches(&r.labels)).count()
                    as u32;
            *spread_counts[ci].entry(v).or_default() += matching;
        }
    }
    let min_match: Vec<u32> = w
        .spread
        .iter()
        .zip(&spread_counts)
        .map(|(c, counts)| {
            if (counts.len() as u32) < c.min_domains {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            }
        })
        .collect();

    let verdict = |node: &Node| -> Result<(), Unfit> {
        // Required affinity: every term's topology on the node, and a selected pod in each of its
        // domains (or the self-affinity exception).
        if !w.pod_affinity.is_empty() {
            let mut pods_exist = true;
            for t in &w.pod_affinity {
                let Some(v) = node.labels.get(&t.topology_key) else { return Err(Unfit::PodAffinity) };
                if affinity.get(&(t.topology_key.as_str(), v.as_str())).copied().unwrap_or(0) == 0 {
                    pods_exist = false;
                }
            }
            if !pods_exist && !self_affine {
                return Err(Unfit::PodAffinity);
            }
        }
        for t in w.pod_anti_affinity() {
            if let Some(v) = node.labels.get(&t.topology_key) {
                if anti.get(&(t.topology_key.as_str(), v.as_str())).copied().unwrap_or(0) > 0 {
                    return Err(Unfit::PodAntiAffinity);
                }
            }
        }
        for (k, v) in &node.labels {
            if existing_anti.get(&(k.as_str(), v.as_str())).copied().unwrap_or(0) > 0 {
                return Err(Unfit::ExistingAntiAffinity);
            }
        }
        if !w.spread.is_empty() {
            if !has_keys(node) {
                return Err(Unfit::TopologySpread);
            }
            for (ci, c) in w.spread.iter().enumerate() {
                let v = node.labels[&c.topology_key].as_str();
                let here = spread_counts[ci].get(v).copied().unwrap_or(0);
                let me_too = u32::from(c.selector.matches(&me.labels));
                if (here + me_too).saturating_sub(min_match[ci]) > c.max_skew {
                    return Err(Unfit::TopologySpread);
                }
            }
        }
        Ok(())
    };
    Some(nodes.iter().map(verdict).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceAssignment, LabelSelector, PodAffinityTerm, SpreadConstraint};
    use std::sync::Arc;

    fn node(name: &str, zone: &str) -> Node {
        Node {
            name: name.into(),
            labels: [("kubernetes.io/hostname", name), ("zone", zone)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn pod(ns: &str, app: &str) -> Workload {
        let labels: BTreeMap<String, String> = [("app".to_string(), app.to_string())].into();
        Workload {
            labels: labels.clone(),
            identity: Some(Arc::new(PodIdentity { namespace: ns.into(), labels, anti_affinity: vec![] })),
            ..Default::default()
        }
    }

    fn term(app: &str, key: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            selector: LabelSelector {
                match_labels: [("app".to_string(), app.to_string())].into(),
                ..Default::default()
            },
            namespaces: vec!["ns".into()],
            topology_key: key.into(),
        }
    }

    fn with_anti(mut w: Workload, t: PodAffinityTerm) -> Workload {
        let mut id = (**w.identity.as_ref().unwrap()).clone();
        id.anti_affinity.push(t);
        w.identity = Some(Arc::new(id));
        w
    }

    /// `TestRequiredAffinitySingleNode`-style cases of interpodaffinity's filtering_test.go.
    #[test]
    fn anti_affinity_affinity_and_the_symmetric_check() {
        let mut nodes = vec![node("a", "z1"), node("b", "z1"), node("c", "z2")];
        nodes[0].allocate_pod(&pod("ns", "db"), &DeviceAssignment::None);
        // Anti-affinity to db by hostname: not on a; by zone: not on a or b.
        let by_host = with_anti(pod("ns", "web"), term("db", "kubernetes.io/hostname"));
        let v = verdicts(&nodes, &by_host, 0).unwrap();
        assert_eq!(v, vec![Err(Unfit::PodAntiAffinity), Ok(()), Ok(())]);
        let by_zone = with_anti(pod("ns", "web"), term("db", "zone"));
        assert_eq!(
            verdicts(&nodes, &by_zone, 0).unwrap(),
            vec![Err(Unfit::PodAntiAffinity), Err(Unfit::PodAntiAffinity), Ok(())]
        );
        // Another namespace's db does not count.
        let other_ns = with_anti(
            pod("other", "web"),
            PodAffinityTerm { namespaces: vec!["other".into()], ..term("db", "zone") },
        );
        assert_eq!(verdicts(&nodes, &other_ns, 0).unwrap(), vec![Ok(()), Ok(()), Ok(())]);
        // Affinity to db by zone: z1 only.
        let mut near = pod("ns", "web");
        near.pod_affinity.push(term("db", "zone"));
        assert_eq!(verdicts(&nodes, &near, 0).unwrap(), vec![Ok(()), Ok(()), Err(Unfit::PodAffinity)]);
        // The symmetric check: a running pod that repels web by zone keeps web out of z1.
        let repeller = with_anti(pod("ns", "cache"), term("web", "zone"));
        nodes[1].allocate_pod(&repeller, &DeviceAssignment::None);
        assert_eq!(
            verdicts(&nodes, &pod("ns", "web"), 1).unwrap(),
            vec![Err(Unfit::ExistingAntiAffinity), Err(Unfit::ExistingAntiAffinity), Ok(())]
        );
        assert!(
            verdicts(&nodes, &pod("ns", "web"), 0).is_none(),
            "nothing to check without holders or terms"
        );
    }

    /// The self-affinity exception (filtering.go `satisfyPodAffinity`): the first pod of a group
    /// that is affine to itself may go wherever the topology exists.
    #[test]
    fn the_first_pod_of_a_self_affine_group_is_placed() {
        let mut nodes = vec![node("a", "z1"), node("b", "z2")];
        nodes[1].labels.remove("zone");
        let mut first = pod("ns", "web");
        first.pod_affinity.push(term("web", "zone"));
        assert_eq!(verdicts(&nodes, &first, 0).unwrap(), vec![Ok(()), Err(Unfit::PodAffinity)]);
        let mut stranger = pod("ns", "api");
        stranger.pod_affinity.push(term("web", "zone"));
        assert_eq!(
            verdicts(&nodes, &stranger, 0).unwrap(),
            vec![Err(Unfit::PodAffinity), Err(Unfit::PodAffinity)]
        );
    }

    fn spread(max_skew: u32, min_domains: u32) -> SpreadConstraint {
        SpreadConstraint {
            max_skew,
            topology_key: "zone".into(),
            selector: LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            },
            min_domains,
            honor_node_affinity: true,
            honor_node_taints: false,
        }
    }

    /// podtopologyspread's filtering_test.go: skew against the emptiest domain, minDomains
    /// treating missing domains as empty, nodes without the key refused.
    #[test]
    fn spread_skew_min_domains_and_missing_keys() {
        let mut nodes = vec![node("a", "z1"), node("b", "z1"), node("c", "z2"), node("d", "")];
        nodes[3].labels.remove("zone");
        for n in [0, 1] {
            nodes[n].allocate_pod(&pod("ns", "web"), &DeviceAssignment::None);
        }
        nodes[2].allocate_pod(&pod("ns", "web"), &DeviceAssignment::None);
        // z1 has 2, z2 has 1: z1 would be 3 - 1 = 2 > 1; z2 2 - 1 = 1.
        let mut w = pod("ns", "web");
        w.spread.push(spread(1, 1));
        assert_eq!(
            verdicts(&nodes, &w, 0).unwrap(),
            vec![Err(Unfit::TopologySpread), Err(Unfit::TopologySpread), Ok(()), Err(Unfit::TopologySpread)]
        );
        // minDomains 3 with two domains: the minimum counts as 0, so z2 (1 + 1 - 0 = 2) fails too.
        w.spread[0] = spread(1, 3);
        assert!(verdicts(&nodes, &w, 0).unwrap().iter().all(|v| v.is_err()));
        // Pods of other namespaces are not counted.
        let mut elsewhere = pod("other", "web");
        elsewhere.spread.push(spread(1, 1));
        assert_eq!(verdicts(&nodes, &elsewhere, 0).unwrap()[0], Ok(()));
    }
}
