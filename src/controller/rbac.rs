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

/// What the controller needs cluster-wide (ClusterRole): watch nodes, pods, PDBs, pod groups, DRA
/// objects, ProvisioningRequests and PodTemplates; cordon (patch) and delete nodes; evict pods;
/// nominate preemptors' nodes (pod status);
/// answer ProvisioningRequests (status); record events in both event APIs.
pub const CONTROLLER_CLUSTER_RULES: &[Rule] = &[
    rule(&[""], &["nodes"], &["get", "list", "watch", "update", "delete"]),
    rule(&[""], &["pods"], &["get", "list", "watch"]),
    rule(&[""], &["pods/eviction"], &["create"]),
    // A preemptor's `status.nominatedNodeName`.
    rule(&[""], &["pods/status"], &["patch"]),
    rule(&["policy"], &["poddisruptionbudgets"], &["list", "watch"]),
    rule(&[""], &["persistentvolumeclaims", "persistentvolumes"], &["list", "watch"]),
    rule(&["storage.k8s.io"], &["storageclasses"], &["list", "watch"]),
    rule(&["scheduling.x-k8s.io"], &["podgroups"], &["list", "watch"]),
    rule(
        &["resource.k8s.io"],
        &["deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates"],
        &["list", "watch"],
    ),
    // ProvisioningRequests and the PodTemplates they name; their conditions are the answer.
    rule(&["autoscaling.x-k8s.io"], &["provisioningrequests"], &["list", "watch"]),
    rule(&["autoscaling.x-k8s.io"], &["provisioningrequests/status"], &["patch"]),
    rule(&[""], &["podtemplates"], &["list", "watch"]),
    rule(&[""], &["events"], &["create", "patch"]),
    rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
];

/// What the controller needs in its own namespace (Role): the leader-election Lease, the
/// status ConfigMaps and the gang scale-ups in progress (ConfigMap `<lease name>-gangs`). Provider and gpuscale config files come as a mounted ConfigMap volume, so
/// no read access to other ConfigMaps or Secrets is needed.
pub const CONTROLLER_NAMESPACE_RULES: &[Rule] = &[
    rule(&["coordination.k8s.io"], &["leases"], &["get", "create", "update"]),
    // Server-side apply of an absent object is authorised as a create as well as a patch.
    rule(&[""], &["configmaps"], &["get", "create", "patch"]),
];

/// What the node agent (DaemonSet) needs cluster-wide: read and annotate its own node, and set
/// its interruption condition.
pub const AGENT_CLUSTER_RULES: &[Rule] =
    &[rule(&[""], &["nodes"], &["get", "patch"]), rule(&[""], &["nodes/status"], &["patch"])];

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

/// What RBAC authorises a Kubernetes API request by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: &'static str,
    /// API group (`""` for core).
    pub api_group: String,
    /// Resource, with `/subresource` when the request is for one.
    pub resource: String,
    /// Namespace of a namespaced request.
    pub namespace: Option<String>,
}

/// The RBAC attributes of a request to a resource path (`/api/v1/namespaces/ns/pods/p/eviction`,
/// `/apis/events.k8s.io/v1/namespaces/ns/events`), as the API server derives them; `watch` is the
/// `watch=true` query parameter. `None` for non-resource paths (`/version`, discovery).
pub fn request_attributes(method: &str, path: &str, watch: bool) -> Option<RequestAttributes> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        // `/namespaces/ns` alone is the namespace object itself.
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, named) = match rest {
        [res] => (res.to_string(), false),
        [res, _name] => (res.to_string(), true),
        [res, _name, sub] => (format!("{res}/{sub}"), true),
        _ => return None,
    };
    let verb = match (method.to_ascii_uppercase().as_str(), named) {
        ("GET" | "HEAD", _) if watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(RequestAttributes { verb, api_group, resource, namespace })
}

/// True when the controller's roles allow the request: the cluster rules anywhere, the namespace
/// rules in `controller_namespace`.
pub fn controller_allows(req: &RequestAttributes, controller_namespace: &str) -> bool {
    allows(CONTROLLER_CLUSTER_RULES, req.verb, &req.api_group, &req.resource)
        || (req.namespace.as_deref() == Some(controller_namespace)
            && allows(CONTROLLER_NAMESPACE_RULES, req.verb, &req.api_group, &req.resource))
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
        assert!(
            allows(c, "update", "", "nodes"),
            "cordon and drain state: read-modify-write with resourceVersion"
        );
        assert!(allows(c, "delete", "", "nodes"));
        assert!(allows(c, "create", "", "pods/eviction"));
        assert!(allows(c, "create", "events.k8s.io", "events"));
        assert!(!allows(c, "delete", "", "pods"), "pods are evicted, never deleted");
        assert!(!allows(c, "create", "", "pods"));
        assert!(!allows(c, "create", "policy", "pods/eviction"), "eviction is in the core group");
        assert!(!allows(c, "get", "", "secrets"));
        assert!(!allows(c, "patch", "", "nodes"));
        let ns = CONTROLLER_NAMESPACE_RULES;
        assert!(allows(ns, "update", "coordination.k8s.io", "leases"));
        assert!(!allows(ns, "delete", "coordination.k8s.io", "leases"));
        assert!(allows(ns, "patch", "", "configmaps"));
        assert!(!allows(ns, "list", "", "configmaps"));
        assert!(!allows(ns, "update", "", "configmaps"), "status maps are server-side applied");
        assert!(allows(AGENT_CLUSTER_RULES, "patch", "", "nodes"));
        assert!(!allows(AGENT_CLUSTER_RULES, "list", "", "nodes"));
    }

    #[test]
    fn requests_map_to_rbac_attributes() {
        let a = request_attributes("POST", "/api/v1/namespaces/ml/pods/p-0/eviction", false).unwrap();
        assert_eq!((a.verb, a.api_group.as_str(), a.resource.as_str()), ("create", "", "pods/eviction"));
        assert_eq!(a.namespace.as_deref(), Some("ml"));
        assert!(controller_allows(&a, "gpuscale-system"));
        let w = request_attributes("GET", "/api/v1/pods", true).unwrap();
        assert_eq!((w.verb, w.namespace.clone()), ("watch", None));
        let l =
            request_attributes("GET", "/apis/coordination.k8s.io/v1/namespaces/gs/leases", false).unwrap();
        assert_eq!(
            (l.verb, l.api_group.as_str(), l.resource.as_str()),
            ("list", "coordination.k8s.io", "leases")
        );
        assert!(!controller_allows(&l, "gs"), "leases are got by name, never listed");
        let u =
            request_attributes("PUT", "/apis/coordination.k8s.io/v1/namespaces/gs/leases/gpuscale", false);
        assert!(controller_allows(&u.clone().unwrap(), "gs"));
        assert!(!controller_allows(&u.unwrap(), "other"), "the Role is only in the controller namespace");
        let d = request_attributes("DELETE", "/api/v1/namespaces/ml/pods", false).unwrap();
        assert_eq!(d.verb, "deletecollection");
        assert!(!controller_allows(&d, "gs"));
        let n = request_attributes("PUT", "/api/v1/nodes/gpu-1", false).unwrap();
        assert_eq!((n.verb, n.resource.as_str(), n.namespace.clone()), ("update", "nodes", None));
        assert!(controller_allows(&n, "gs"));
        let p = request_attributes("PATCH", "/api/v1/nodes/gpu-1", false).unwrap();
        assert!(!controller_allows(&p, "gs"), "only the agent patches nodes");
        assert_eq!(request_attributes("GET", "/version", false), None);
        assert_eq!(request_attributes("GET", "/apis/events.k8s.io/v1", false), None);
    }

    #[test]
    fn wildcards_match_like_rbac() {
        const ANY: &[Rule] = &[rule(&["*"], &["pods/*"], &["get"])];
        assert!(allows(ANY, "get", "apps", "pods/log"));
        assert!(!allows(ANY, "get", "", "pods"));
        assert!(!allows(ANY, "list", "", "pods/log"));
        assert_eq!(expand(AGENT_CLUSTER_RULES).len(), 3);
        // One (group, resource, verb) per grant, none lost or duplicated by the expansion.
        let grants: usize = CONTROLLER_CLUSTER_RULES
            .iter()
            .map(|r| r.api_groups.len() * r.resources.len() * r.verbs.len())
            .sum();
        let expanded = expand(CONTROLLER_CLUSTER_RULES);
        assert_eq!(expanded.len(), grants);
        for (g, res, v) in &expanded {
            assert!(allows(CONTROLLER_CLUSTER_RULES, v, g, res), "{g}/{res} {v}");
        }
        let slices = ("resource.k8s.io".to_string(), "resourceslices".to_string(), "watch".to_string());
        assert!(expanded.contains(&slices));
    }
}
