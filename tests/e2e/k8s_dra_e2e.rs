//! DRA end to end (#22): the same snapshot planned by gpuscale and given to a real kube-apiserver
//! and kube-scheduler 1.35, whose DynamicResources plugin allocates the claims. Every pending pod
//! gpuscale places goes to the node kube-scheduler binds it to, and the pod gpuscale cannot place
//! kube-scheduler leaves pending: once with named ResourceClaims, once with ResourceClaimTemplates,
//! whose claims kube-controller-manager's resourceclaim controller generates for each pod; and a
//! node with GPUs both through the device plugin and through DRA.

use crate::controlplane;
use crate::dra;

use controlplane::{ControlPlane, Options};
use dra::*;
use gpuscale::k8s::SourcedObject;
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn named_claim(name: &str, class: &str, count: u32, selectors: &[&str]) -> Value {
    let mut c = claim(name, class, count);
    let sel: Vec<Value> = selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect();
    c["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = json!(sel);
    c
}

/// The cluster, the claims and the pods. With `templates`, each pod but the shared claim's readers
/// gets its claim from a ResourceClaimTemplate of the same name instead.
fn scenario(templates: bool) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let own_claim = |name: &str, class: &str, count: u32, selectors: &[&str]| match templates {
        true => template(name, class, count, selectors),
        false => named_claim(name, class, count, selectors),
    };
    let mut mig = Vec::new();
    for g in 0..2 {
        mig.push(mig_device(g, "3g.20gb", 9, 0, 4, "19968Mi"));
        mig.push(mig_device(g, "2g.10gb", 14, 4, 2, "9856Mi"));
    }
    let mut base = device_classes();
    base.extend([
        node("h100-a", H100, "h100", 8, 0),
        node("l4-a", L4, "l4", 4, 0),
        node("a100-a", A100, "a100", 2, 0),
        slice("h100-a", gpus(8, H100)),
        slice("l4-a", gpus(4, L4)),
        slice("a100-a", mig),
    ]);
    // Five of h100-a's GPUs are allocated already.
    let busy = allocated(
        claim("busy", "gpu.nvidia.com", 5),
        "h100-a",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"],
        "x",
    );
    let claims = vec![
        busy,
        own_claim("four", "gpu.nvidia.com", 4, &[]),
        own_claim(
            "big-mem",
            "gpu.nvidia.com",
            1,
            &["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"],
        ),
        own_claim(
            "mig-2g",
            "mig.nvidia.com",
            1,
            &["device.attributes['gpu.nvidia.com'].profile == '2g.10gb'"],
        ),
        named_claim(
            "shared-h100",
            "gpu.nvidia.com",
            1,
            &["device.attributes['gpu.nvidia.com'].productName.matches('H100')"],
        ),
        own_claim(
            "five-l4",
            "gpu.nvidia.com",
            5,
            &["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'"],
        ),
    ];
    let pods = vec![
        pod("want4", "four", templates),
        pod("big", "big-mem", templates),
        pod("mig", "mig-2g", templates),
        pod("reader-0", "shared-h100", false),
        pod("reader-1", "shared-h100", false),
        pod("too-many", "five-l4", templates),
    ];
    (base, claims, pods)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_binds_dra_pods_where_the_plan_places_them() {
    plan_and_kube_scheduler_agree(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_with_claim_templates_are_bound_where_the_plan_places_them() {
    plan_and_kube_scheduler_agree(true).await;
}

/// A node with four GPUs through the device plugin and four through DRA serves a pod of each
/// kind; a second device-plugin pod finds no room (the DRA GPUs are not `nvidia.com/gpu`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_device_plugin_and_dra_gpus_binds_both_kinds_of_pod_as_planned() {
    let mut base = device_classes();
    base.extend([
        node("h100-mixed", H100, "h100", 8, 4),
        slice("h100-mixed", (4..8).map(|i| gpu_device(i, H100)).collect()),
    ]);
    let plugin = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
          "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "resources": {
              "requests": {"cpu": "1", "nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}}]},
          "status": {"phase": "Pending"}})
    };
    let pods = vec![pod("dra", "four", false), plugin("plugin"), plugin("plugin-2")];
    let expected = plan_of(&base, &[claim("four", "gpu.nvidia.com", 4)], &pods);
    assert_eq!(expected["ml/dra"].as_deref(), Some("h100-mixed"));
    assert_eq!(expected["ml/plugin"].as_deref(), Some("h100-mixed"));
    assert_eq!(expected["ml/plugin-2"], None);
    bound_as_planned(&base, &[claim("four", "gpu.nvidia.com", 4)], &pods, expected, vec![]).await;
}

/// Where the plan puts each pending pod (`None`: unschedulable).
fn plan_of(base: &[Value], claims: &[Value], pods: &[Value]) -> BTreeMap<String, Option<String>> {
    let all: Vec<Value> = base.iter().chain(claims).chain(pods).cloned().collect();
    let objects: Vec<SourcedObject> = all.iter().cloned().map(|o| SourcedObject::new("e2e", o)).collect();
    let snapshot = gpuscale::k8s::convert(&objects).expect("valid snapshot").snapshot;
    let plan = planner::plan(
        &PlanInput { snapshot, groups: Vec::new(), unavailable: Default::default(), ..Default::default() },
        &PlannerSettings { scale_down: false, consolidation: false, ..Default::default() },
    );
    let mut expected: BTreeMap<String, Option<String>> = BTreeMap::new();
    for p in &plan.placements {
        expected.insert(p.pod.clone(), Some(p.node.clone()));
    }
    for u in &plan.unschedulable {
        expected.insert(u.pod.clone(), None);
    }
    assert_eq!(expected.len(), pods.len(), "{plan:?}");
    expected
}

async fn plan_and_kube_scheduler_agree(templates: bool) {
    let (base, claims, pods) = scenario(templates);
    let expected = plan_of(&base, &claims, &pods);
    // The plan itself (so a silent agreement on nothing cannot pass).
    assert_eq!(expected["ml/want4"].as_deref(), Some("l4-a"));
    assert_eq!(expected["ml/big"].as_deref(), Some("h100-a"));
    assert_eq!(expected["ml/mig"].as_deref(), Some("a100-a"));
    assert_eq!(expected["ml/reader-0"].as_deref(), Some("h100-a"));
    assert_eq!(expected["ml/too-many"], None);
    let controllers = if templates { vec!["resourceclaim-controller"] } else { vec![] };
    let cp = bound_as_planned(&base, &claims, &pods, expected, controllers).await;
    // kube-scheduler allocated the shared claim once, on the node both readers run on.
    let shared = cp
        .raw("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/shared-h100", None)
        .await
        .unwrap();
    assert_eq!(shared["status"]["allocation"]["devices"]["results"].as_array().map(Vec::len), Some(1));
    if templates {
        // Each bound pod's claim was generated from its template, and allocated where it runs.
        let list = cp.raw("GET", "/api/v1/namespaces/ml/pods/want4", None).await.unwrap();
        let generated = list["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().unwrap();
        let claim = cp
            .raw("GET", &format!("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{generated}"), None)
            .await
            .unwrap();
        assert_eq!(claim["metadata"]["ownerReferences"][0]["name"], "want4", "{claim}");
        let results =
            claim["status"]["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(results.len(), 4, "{claim}");
        assert!(results.iter().all(|r| r["pool"] == "l4-a"), "{claim}");
    }
}

/// Creates the objects in a real control plane (running `controllers` of
/// kube-controller-manager) and requires kube-scheduler to bind every pod where `expected` says,
/// and to leave unschedulable the pods it says have no node.
async fn bound_as_planned(
    base: &[Value],
    claims: &[Value],
    pods: &[Value],
    expected: BTreeMap<String, Option<String>>,
    controllers: Vec<&'static str>,
) -> ControlPlane {
    let cp = ControlPlane::start(Options { controllers, ..Default::default() }).await;
    cp.ensure_namespace("ml").await;
    let post = |o: Value| {
        let cp = &cp;
        async move {
            let path = controlplane::object_path(&o);
            let collection = path.rsplit_once('/').unwrap().0.to_string();
            let created = cp
                .raw("POST", &collection, Some(o.clone()))
                .await
                .unwrap_or_else(|e| panic!("create {path}: {e}"));
            if o.get("status").is_some_and(|s| !s.is_null()) && o["kind"] != "Pod" {
                cp.raw_patch(&format!("{path}/status"), &json!({"status": o["status"]})).await;
            }
            created
        }
    };
    for o in base.iter().chain(claims) {
        post(o.clone()).await;
    }
    // Allocations of running claims are in place before any pod is scheduled (else their
    // devices would look free).
    for c in claims.iter().filter(|c| !c["status"]["allocation"].is_null()) {
        let path = controlplane::object_path(c);
        let now = cp.raw("GET", &path, None).await.unwrap();
        let results = |c: &Value| c["status"]["allocation"]["devices"]["results"].as_array().map(Vec::len);
        assert_eq!(results(&now), results(c), "{now}");
    }
    for n in base.iter().filter(|o| o["kind"] == "Node") {
        // Lift the not-ready taint admission gave the new Node, as the node lifecycle controller
        // does for a Ready node.
        let path = format!("/api/v1/nodes/{}", n["metadata"]["name"].as_str().unwrap());
        cp.raw_patch(&path, &json!({"spec": {"taints": null}})).await;
    }
    for p in pods {
        post(p.clone()).await;
    }

    // kube-scheduler's informers see the slices, classes and pods in no set order, so a pod can be
    // marked Unschedulable once and bound when the missing object arrives: only a binding is
    // final. Wait for agreement (failing at once on a binding the plan does not make), then hold
    // it a few seconds so a pod the plan leaves pending is not bound by a retry.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut agreed_since: Option<Instant> = None;
    loop {
        let got = decisions(&cp).await;
        let wrong: Vec<_> =
            got.iter().filter(|(id, n)| n.is_some() && expected.get(*id) != Some(*n)).collect();
        assert!(
            wrong.is_empty(),
            "kube-scheduler bound {wrong:?} where the plan does not: kube-scheduler (left) and the plan (right) disagree\n{got:?}\n{expected:?}\n{}",
            cp.scheduler_log()
        );
        if got == expected {
            let since = *agreed_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(3) {
                break;
            }
        } else {
            agreed_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "after 120 s kube-scheduler (left) and the plan (right) disagree\n{got:?}\n{expected:?}\n{}",
            cp.scheduler_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cp
}

/// kube-scheduler's decision so far for each pod: the node it is bound to, or `None` once it is
/// marked Unschedulable.
async fn decisions(cp: &ControlPlane) -> BTreeMap<String, Option<String>> {
    let mut got = BTreeMap::new();
    let list = cp.raw("GET", "/api/v1/namespaces/ml/pods", None).await.expect("list pods");
    for p in list["items"].as_array().unwrap() {
        let id = format!("ml/{}", p["metadata"]["name"].as_str().unwrap());
        if let Some(n) = p["spec"]["nodeName"].as_str() {
            got.insert(id, Some(n.to_string()));
        } else if p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable")
        {
            got.insert(id, None);
        }
    }
    got
}
