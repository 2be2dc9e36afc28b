//! The least-privilege RBAC rules the controller and the agent need, as data.
//!
//! These constants are the contract between the code and the Helm chart: the controller and the
//! agent make only the requests these rules allow, and `charts/gpuscale` grants exactly these
//! rules (`tests/chart_render.rs` checks both the chart and, through [`allows`], the requests the
//! integration tests record).

/// One RBAC policy rule: every verb on every resource of every API group listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// API groups (`""` is the core group).
    pub api_groups: &'static [&'static str],
    /// Resources, with `/subresource` where the rule is for a subresource.
    pub resources: &'static [&'static str],
    /// Verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`).
    pub verbs: &'static [&'static str],
}

const fn rule(
    api_groups: &'static [&'static str],
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
) -> Rule {
    Rule { api_groups, resources, verbs }
}

/// What the controller needs cluster-wide (ClusterRole): watch nodes, pods, PDBs and pod groups;
/// cordon (patch) and delete nodes; evict pods; record events in both event APIs.
pub const CONTROLLER_CLUSTER_RULES: &[Rule] = &[
    rule(&[""], &["nodes"], &["get", "list", "watch", "patch", "delete"]),
    rule(&[""], &["pods"], &["get", "list", "watch"]),
    rule(&[""], &["pods/eviction"], &["create"]),
    rule(&["policy"], &["poddisruptionbudgets"], &["list", "watch"]),
    rule(&["scheduling.x-k8s.io"], &["podgroups"], &["list", "watch"]),
    rule(&[""], &["events"], &["create", "patch"]),
    rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
];

/// What the controller needs in its own namespace (Role): the leader-election Lease and the
/// status ConfigMaps. Provider and gpuscale config files come as a mounted ConfigMap volume, so
/// no read access to other ConfigMaps or Secrets is needed.
pub const CONTROLLER_NAMESPACE_RULES: &[Rule] = &[
    rule(&["coordination.k8s.io"], &["leases"], &["get", "create", "update"]),
    rule(&[""], &["configmaps"], &["get", "create", "update", "patch"]),
];

/// What the node agent (DaemonSet) needs cluster-wide: read and annotate its own node.
pub const AGENT_CLUSTER_RULES: &[Rule] = &[rule(&[""], &["nodes"], &["get", "patch"])];

/// True when `rules` allow `verb` on `resource` (`pods` or `pods/eviction`) of `api_group`
/// (`""` for core), with RBAC's matching: exact names, `*` as a wildcard in any position.
pub fn allows(rules: &[Rule], verb: &str, api_group: &str, resource: &str) -> bool {
    let matches = |list: &[&str], want: &str| list.iter().any(|x| *x == "*" || *x == want);
    rules.iter().any(|r| {
        matches(r.verbs, verb)
            && matches(r.api_groups, api_group)
            && r.resources.iter().any(|x| {
                *x == "*"
                    || *x == resource
                    // `pods/*` allows every subresource of pods, `*/scale` a subresource of all.
                    || match (x.split_once('/'), resource.split_once('/')) {
                        (Some((xr, "*")), Some((rr, _))) => xr == rr,
                        (Some(("*", xs)), Some((_, rs))) => xs == rs,
                        _ => false,
                    }
            })
    })
}

/// The rules as `(api group, resource, verb)` triples, sorted: the set a role grants, for
/// comparing roles whatever the grouping of their rules.
pub fn expand(rules: &[Rule]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = rules
        .iter()
        .flat_map(|r| {
            r.api_groups.iter().flat_map(move |g| {
                r.resources.iter().flat_map(move |res| {
                    r.verbs.iter().map(move |v| (g.to_string(), res.to_string(), v.to_string()))
                })
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_rules_allow_what_the_controller_does_and_nothing_more() {
        let c = CONTROLLER_CLUSTER_RULES;
        assert!(allows(c, "watch", "", "nodes"));
        assert!(allows(c, "patch", "", "nodes"));
        assert!(allows(c, "delete", "", "nodes"));
        assert!(allows(c, "create", "", "pods/eviction"));
        assert!(allows(c, "create", "events.k8s.io", "events"));
        assert!(!allows(c, "delete", "", "pods"), "pods are evicted, never deleted");
        assert!(!allows(c, "create", "", "pods"));
        assert!(!allows(c, "create", "policy", "pods/eviction"), "eviction is in the core group");
        assert!(!allows(c, "get", "", "secrets"));
        assert!(!allows(c, "update", "", "nodes"));
        let ns = CONTROLLER_NAMESPACE_RULES;
        assert!(allows(ns, "update", "coordination.k8s.io", "leases"));
        assert!(!allows(ns, "delete", "coordination.k8s.io", "leases"));
        assert!(allows(ns, "patch", "", "configmaps"));
        assert!(!allows(ns, "list", "", "configmaps"));
        assert!(allows(AGENT_CLUSTER_RULES, "patch", "", "nodes"));
        assert!(!allows(AGENT_CLUSTER_RULES, "list", "", "nodes"));
    }

    #[test]
    fn wildcards_match_like_rbac() {
        const ANY: &[Rule] = &[rule(&["*"], &["pods/*"], &["get"])];
        assert!(allows(ANY, "get", "apps", "pods/log"));
        assert!(!allows(ANY, "get", "", "pods"));
        assert!(!allows(ANY, "list", "", "pods/log"));
        assert_eq!(expand(AGENT_CLUSTER_RULES).len(), 2);
        assert_eq!(expand(CONTROLLER_CLUSTER_RULES).len(), 5 + 3 + 1 + 2 + 2 + 2 + 2);
    }
}
