//! The fake Kubernetes API server (tests/support/apiserver) driven by kube's real client,
//! watcher and reflector over HTTP: the proof that it is faithful enough to test the controller.

use crate::apiserver;

use apiserver::{FakeApiServer, Fault, Settings};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn pod(ns: &str, name: &str, labels: Value, node: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

fn api_code(err: &kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

/// (namespace, name, resourceVersion) of every pod the server holds.
fn server_pods(server: &FakeApiServer) -> BTreeSet<(String, String, String)> {
    server
        .list("pods", None)
        .iter()
        .map(|p| {
            let m = &p["metadata"];
            (
                m["namespace"].as_str().unwrap().to_string(),
                m["name"].as_str().unwrap().to_string(),
                m["resourceVersion"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn store_pods(store: &reflector::Store<Pod>) -> BTreeSet<(String, String, String)> {
    store
        .state()
        .iter()
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any(), p.resource_version().unwrap_or_default()))
        .collect()
}

async fn converge(server: &FakeApiServer, store: &reflector::Store<Pod>, what: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (want, got) = (server_pods(server), store_pods(store));
        if want == got {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("reflector did not converge ({what}):\nserver: {want:?}\nstore:  {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn reflector_converges_through_writes_and_a_forced_relist() {
    let server = FakeApiServer::start().await;
    server.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    for i in 0..5 {
        server.create(pod("default", &format!("p{i}"), json!({"app": "x"}), None));
    }
    server.create(pod("team-a", "a0", json!({"app": "y"}), None));

    let client = server.client();
    let api: Api<Pod> = Api::all(client.clone());
    let (reader, writer) = reflector::store::<Pod>();
    // The default watcher config (paged list, then watch with bookmarks), plus a second
    // reflector listing one item per page.
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default())).default_backoff();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let (paged_reader, paged_writer) = reflector::store::<Pod>();
    let paged = reflector(paged_writer, watcher(api.clone(), watcher::Config::default().page_size(1)))
        .default_backoff();
    let paged_task = tokio::spawn(paged.for_each(|_| async {}));
    tokio::time::timeout(WAIT, reader.wait_until_ready()).await.expect("reflector ready").unwrap();
    converge(&server, &reader, "initial list").await;
    converge(&server, &paged_reader, "initial paged list").await;
    let pages = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && r.param("continue").is_some())
        .count();
    assert!(
        pages >= 5,
        "the page_size(1) reflector should continue the list page by page, saw {pages} continues"
    );

    // Writes over HTTP: create, update, status update, delete.
    let default_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created: Pod =
        serde_json::from_value(pod("default", "new", json!({"app": "x"}), Some("n1"))).unwrap();
    default_pods.create(&PostParams::default(), &created).await.unwrap();
    default_pods
        .patch("p1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "z"}}})))
        .await
        .unwrap();
    server.set_pod_phase("default", "p2", "Running");
    default_pods.delete("p3", &DeleteParams::default()).await.unwrap();
    converge(&server, &reader, "after writes").await;
    converge(&server, &paged_reader, "after writes (paged)").await;

    // Force a 410: forget the history and cut the watches; writes made meanwhile must still
    // reach the store through a re-list.
    let lists_before = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && r.method == "GET" && !r.is_watch())
        .count();
    server.expire_history();
    server.create(pod("default", "after-410", json!({}), None));
    server.delete("pods", "default", "p4").unwrap();
    converge(&server, &reader, "after the forced 410").await;
    converge(&server, &paged_reader, "after the forced 410 (paged)").await;
    let lists_after = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && r.method == "GET" && !r.is_watch())
        .count();
    assert!(lists_after > lists_before, "a 410 must make the watchers re-list");
    assert!(server.expired_watches() >= 2, "both watchers should have been answered 410 Gone");

    // And live again afterwards.
    default_pods.delete("p0", &DeleteParams::default()).await.unwrap();
    converge(&server, &reader, "live after re-list").await;
    task.abort();
    paged_task.abort();
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_as_an_error_event() {
    let server = FakeApiServer::start_with(Settings { history_len: 3, ..Default::default() }).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first = api
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "c0"}})).unwrap())
        .await
        .unwrap();
    let rv0 = first.resource_version().unwrap();
    for i in 1..6 {
        api.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let mut stream = api.watch(&WatchParams::default(), &rv0).await.unwrap().boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(e.message.contains("too old resource version"), "{}", e.message);
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(stream.try_next().await.unwrap().is_none(), "the stream ends after the 410");

    // A recent resourceVersion replays only what came after it, then goes live.
    let recent = server.resource_version() - 1;
    let mut stream =
        api.watch(&WatchParams::default().timeout(5), &recent.to_string()).await.unwrap().boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), "c5"),
        other => panic!("expected ADDED c5, got {other:?}"),
    }
    api.delete("c5", &DeleteParams::default()).await.unwrap();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(cm)) => assert_eq!(cm.name_any(), "c5"),
        other => panic!("expected DELETED c5, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_sends_bookmarks_and_honours_timeout_seconds() {
    let server = FakeApiServer::start_with(Settings {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let api: Api<Node> = Api::all(server.client());
    let rv = server.resource_version().to_string();
    let events: Vec<_> = tokio::time::timeout(
        WAIT,
        api.watch(&WatchParams { bookmarks: true, ..Default::default() }.timeout(1), &rv)
            .await
            .unwrap()
            .collect::<Vec<_>>(),
    )
    .await
    .expect("timeoutSeconds=1 must end the watch");
    assert!(
        events.iter().any(|e| matches!(e, Ok(WatchEvent::Bookmark(b)) if b.metadata.resource_version == rv)),
        "expected a bookmark at {rv}: {events:?}"
    );
}

#[tokio::test]
async fn label_and_field_selectors_on_lists_and_watches() {
    let server = FakeApiServer::start().await;
    server.create(pod("default", "a1", json!({"app": "a", "tier": "gpu"}), Some("n1")));
    server.create(pod("default", "a2", json!({"app": "a"}), Some("n2")));
    server.create(pod("default", "b1", json!({"app": "b", "tier": "cpu"}), None));
    server.set_pod_phase("default", "a1", "Running");
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    let names = |lp: ListParams| {
        let api = api.clone();
        async move { api.list(&lp).await.unwrap().items.iter().map(|p| p.name_any()).collect::<Vec<_>>() }
    };
    assert_eq!(names(ListParams::default().labels("app=a")).await, ["a1", "a2"]);
    assert_eq!(names(ListParams::default().labels("app==a,tier")).await, ["a1"]);
    assert_eq!(names(ListParams::default().labels("app!=a")).await, ["b1"]);
    assert_eq!(names(ListParams::default().labels("tier in (gpu,cpu)")).await, ["a1", "b1"]);
    assert_eq!(names(ListParams::default().labels("tier notin (gpu)")).await, ["a2", "b1"]);
    assert_eq!(names(ListParams::default().labels("!tier")).await, ["a2"]);
    assert_eq!(names(ListParams::default().fields("spec.nodeName=n2")).await, ["a2"]);
    assert_eq!(names(ListParams::default().fields("spec.nodeName=")).await, ["b1"]);
    assert_eq!(names(ListParams::default().fields("status.phase!=Running,metadata.name!=b1")).await, ["a2"]);
    assert_eq!(
        names(ListParams::default().fields("metadata.namespace=default").labels("app=b")).await,
        ["b1"]
    );
    let err = api.list(&ListParams::default().fields("spec.bogus=1")).await.unwrap_err();
    assert_eq!(api_code(&err), (400, "BadRequest".into()));

    // A watch with a selector sees an object leave the selection as DELETED and enter it as
    // ADDED.
    let rv = server.resource_version().to_string();
    let mut stream =
        api.watch(&WatchParams::default().labels("app=a").timeout(10), &rv).await.unwrap().boxed();
    api.patch("a2", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "c"}}})))
        .await
        .unwrap();
    api.patch("b1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "a"}}})))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.try_next().await.unwrap() {
            Some(WatchEvent::Deleted(p)) => seen.push(format!("DELETED {}", p.name_any())),
            Some(WatchEvent::Added(p)) => seen.push(format!("ADDED {}", p.name_any())),
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["DELETED a2", "ADDED b1"]);
}

#[tokio::test]
async fn paging_is_a_consistent_snapshot() {
    let server = FakeApiServer::start().await;
    for i in 0..7 {
        server
            .create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm{i}")}}));
    }
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first = api.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    let rv = first.metadata.resource_version.clone().unwrap();
    // Writes between pages do not show up in the continued list.
    server.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm9"}}));
    server.delete("configmaps", "default", "cm5").unwrap();
    let mut names: Vec<String> = first.items.iter().map(|c| c.name_any()).collect();
    let mut token = first.metadata.continue_;
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = api.list(&ListParams::default().limit(3).continue_token(&t)).await.unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()));
        names.extend(page.items.iter().map(|c| c.name_any()));
        token = page.metadata.continue_;
    }
    assert_eq!(names, (0..7).map(|i| format!("cm{i}")).collect::<Vec<_>>());
    let err = api.list(&ListParams::default().continue_token("ff.3")).await.unwrap_err();
    assert_eq!(api_code(&err).0, 410);
}

#[tokio::test]
async fn crud_errors_are_kube_api_errors() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "one"}, "data": {"k": "v"}})).unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(
        api_code(&api.create(&PostParams::default(), &cm).await.unwrap_err()),
        (409, "AlreadyExists".into())
    );
    assert_eq!(api_code(&api.get("missing").await.unwrap_err()), (404, "NotFound".into()));
    let generated: ConfigMap = serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).unwrap();
    let g = api.create(&PostParams::default(), &generated).await.unwrap();
    assert!(g.name_any().starts_with("gen-") && g.name_any().len() == 9, "{}", g.name_any());
    let missing_ns: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    assert_eq!(api_code(&missing_ns.create(&PostParams::default(), &cm).await.unwrap_err()).0, 404);

    // Delete with a stale uid precondition is a conflict; with the right one it goes.
    let stale = DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid: Some("x".into()), resource_version: None }),
        ..Default::default()
    };
    assert_eq!(api_code(&api.delete("one", &stale).await.unwrap_err()), (409, "Conflict".into()));
    let ok = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.delete("one", &ok).await.unwrap();
    assert!(server.get("configmaps", "default", "one").is_none());

    // Finalizers hold a deletion until they are removed.
    let held: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["gpuscale.io/x"]}}))
            .unwrap();
    api.create(&PostParams::default(), &held).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let terminating = api.get("held").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    api.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert_eq!(api_code(&api.get("held").await.unwrap_err()).0, 404);
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .unwrap()
}

#[tokio::test]
async fn leases_have_optimistic_concurrency() {
    let server = FakeApiServer::start().await;
    let a: Api<Lease> = Api::namespaced(server.replica_client("a"), "kube-system");
    let b: Api<Lease> = Api::namespaced(server.replica_client("b"), "kube-system");
    a.create(&PostParams::default(), &lease("gpuscale", "a")).await.unwrap();
    assert_eq!(
        api_code(&b.create(&PostParams::default(), &lease("gpuscale", "b")).await.unwrap_err()).0,
        409
    );
    // Both read the same version; the first writer wins, the second gets 409 Conflict.
    let mut seen_a = a.get("gpuscale").await.unwrap();
    let mut seen_b = b.get("gpuscale").await.unwrap();
    seen_a.spec.as_mut().unwrap().lease_transitions = Some(1);
    seen_b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let renewed = a.replace("gpuscale", &PostParams::default(), &seen_a).await.unwrap();
    assert_ne!(renewed.resource_version(), seen_a.resource_version());
    let err = b.replace("gpuscale", &PostParams::default(), &seen_b).await.unwrap_err();
    assert_eq!(api_code(&err), (409, "Conflict".into()));
    // A patch carrying a stale resourceVersion is a precondition too.
    let stale =
        json!({"metadata": {"resourceVersion": seen_b.resource_version()}, "spec": {"holderIdentity": "b"}});
    assert_eq!(
        api_code(&b.patch("gpuscale", &PatchParams::default(), &Patch::Merge(stale)).await.unwrap_err()).0,
        409
    );
    let lease = server.get("lease", "kube-system", "gpuscale").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    let replicas: Vec<(String, Option<String>, u16)> = server
        .requests()
        .iter()
        .filter(|r| r.method == "PUT")
        .map(|r| (r.path.clone(), r.replica.clone(), r.status))
        .collect();
    assert_eq!(
        replicas,
        [
            (
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale".into(),
                Some("a".into()),
                200
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale".into(),
                Some("b".into()),
                409
            ),
        ]
    );
}

fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu": "a100"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]},
    })
}

#[tokio::test]
async fn patches_merge_json_strategic_and_apply() {
    let server = FakeApiServer::start().await;
    server.create(node("n1"));
    let nodes: Api<Node> = Api::all(server.client());
    let gen0 = nodes.get("n1").await.unwrap().metadata.generation.unwrap();

    // Cordon: merge patch of spec.unschedulable; the taint is added by read-modify-write with
    // the resourceVersion as precondition (taints are an atomic list in Kubernetes).
    let cordoned = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}})))
        .await
        .unwrap();
    assert_eq!(cordoned.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(cordoned.metadata.generation, Some(gen0 + 1));
    let mut taints = cordoned.spec.as_ref().unwrap().taints.clone().unwrap();
    taints.push(
        serde_json::from_value(json!({"key": "gpuscale.io/draining", "effect": "NoSchedule"})).unwrap(),
    );
    let patch = json!({
        "metadata": {"resourceVersion": cordoned.resource_version()},
        "spec": {"taints": taints},
    });
    let tainted = nodes.patch("n1", &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
    let keys: Vec<String> = tainted.spec.unwrap().taints.unwrap().iter().map(|t| t.key.clone()).collect();
    assert_eq!(keys, ["nvidia.com/gpu", "gpuscale.io/draining"]);
    // A strategic patch with one taint replaces the list, as on a real server.
    let only = json!({"spec": {"taints": [{"key": "only", "effect": "NoExecute"}]}});
    let replaced = nodes.patch("n1", &PatchParams::default(), &Patch::Strategic(only)).await.unwrap();
    assert_eq!(replaced.spec.unwrap().taints.unwrap().len(), 1);

    // Strategic merge of status conditions by type (status subresource), keeping the others.
    let cond =
        json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}]}});
    let st = nodes.patch_status("n1", &PatchParams::default(), &Patch::Strategic(cond)).await.unwrap();
    let conds = st.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!((conds[0].type_.as_str(), conds[0].status.as_str()), ("Ready", "False"));
    // Status is not writable through the main resource.
    let ignored = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes.patch("n1", &PatchParams::default(), &Patch::Merge(ignored)).await.unwrap();
    assert_eq!(server.get("node", "", "n1").unwrap()["status"]["conditions"][0]["status"], "False");

    // JSON patch, with a failing test op answered 422.
    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/labels/zone", "value": "z1"},
        {"op": "remove", "path": "/metadata/labels/gpu"},
    ]))
    .unwrap();
    let j = nodes.patch("n1", &PatchParams::default(), &Patch::Json::<()>(jp)).await.unwrap();
    assert_eq!(j.labels().get("zone").map(String::as_str), Some("z1"));
    assert!(!j.labels().contains_key("gpu"));
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/labels/zone", "value": "nope"}]))
            .unwrap();
    let err = nodes.patch("n1", &PatchParams::default(), &Patch::Json::<()>(failing)).await.unwrap_err();
    assert_eq!(api_code(&err).0, 422);

    // Strategic merge of pod containers by name: one image changes, the other container stays.
    let mut two = pod("default", "p", json!({}), Some("n1"));
    two["spec"]["containers"] =
        json!([{"name": "main", "image": "busybox"}, {"name": "side", "image": "envoy"}]);
    server.create(two);
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let image = json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}});
    let p = pods.patch("p", &PatchParams::default(), &Patch::Strategic(image)).await.unwrap();
    let cs: Vec<(String, Option<String>)> =
        p.spec.unwrap().containers.iter().map(|c| (c.name.clone(), c.image.clone())).collect();
    assert_eq!(cs, [("main".into(), Some("busybox:2".into())), ("side".into(), Some("envoy".into()))]);
    // Pod specs are otherwise immutable, as on a real server (nodeName goes through binding).
    let add = json!({"spec": {"containers": [{"name": "extra", "image": "x"}]}});
    let err = pods.patch("p", &PatchParams::default(), &Patch::Strategic(add)).await.unwrap_err();
    assert_eq!(api_code(&err), (422, "Invalid".into()));
    let err = pods
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"spec": {"nodeName": "n2"}})))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err).0, 422);
    let tol = json!({"spec": {"tolerations": [{"key": "gpuscale.io/draining", "operator": "Exists"}]}});
    pods.patch("p", &PatchParams::default(), &Patch::Merge(tol)).await.unwrap();

    // Server-side apply: creates when absent, merges after, and drops what the same manager
    // stopped applying.
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let pp = PatchParams::apply("gpuscale").force();
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "state"}, "data": {"a": "1", "b": "2"}});
    cms.patch("state", &pp, &Patch::Apply(&applied)).await.unwrap();
    cms.patch("state", &PatchParams::default(), &Patch::Merge(json!({"data": {"other": "kept"}})))
        .await
        .unwrap();
    let again =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "state"}, "data": {"a": "3"}});
    let cm = cms.patch("state", &pp, &Patch::Apply(&again)).await.unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data.get("a").map(String::as_str), Some("3"));
    assert_eq!(data.get("other").map(String::as_str), Some("kept"));
    assert!(!data.contains_key("b"), "a field the manager stopped applying goes away");
    let no_manager = cms.patch("state", &PatchParams::default(), &Patch::Apply(&again)).await.unwrap_err();
    assert_eq!(api_code(&no_manager).0, 400);
    let ct: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .filter_map(|r| r.content_type.clone())
        .collect();
    for expected in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
    ] {
        assert!(ct.iter().any(|c| c == expected), "no {expected} request in {ct:?}");
    }
}

fn pdb(name: &str, min_available: Value) -> Value {
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "train"}}},
    })
}

#[tokio::test]
async fn eviction_respects_pod_disruption_budgets() {
    let server = FakeApiServer::start().await;
    for i in 0..3 {
        server.create(pod("default", &format!("t{i}"), json!({"app": "train"}), Some("n1")));
    }
    server.set_pod_phase("default", "t0", "Running");
    server.set_pod_phase("default", "t1", "Running");
    server.set_pod_phase("default", "t2", "Running");
    server.set_pod_ready("default", "t2", false);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(server.client(), "default");
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb("train", json!(1))).unwrap())
        .await
        .unwrap();
    let status = pdbs.get("train").await.unwrap().status.unwrap();
    assert_eq!(
        (status.expected_pods, status.current_healthy, status.desired_healthy, status.disruptions_allowed),
        (Some(3), Some(2), Some(1), Some(1))
    );
    assert_eq!(status.observed_generation, Some(1));

    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    // The first eviction is allowed and spends the budget.
    pods.evict("t0", &EvictParams::default()).await.unwrap();
    assert!(server.get("pod", "default", "t0").is_none());
    assert_eq!(pdbs.get("train").await.unwrap().status.unwrap().disruptions_allowed, Some(0));
    // The second is refused with 429 naming the budget.
    let err = pods.evict("t1", &EvictParams::default()).await.unwrap_err();
    let kube::Error::Api(s) = &err else { panic!("{err:?}") };
    assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(s.message, "Cannot evict pod as it would violate the pod's disruption budget.");
    let cause = &s.details.as_ref().unwrap().causes[0];
    assert_eq!(cause.message, "The disruption budget train needs 1 healthy pods and has 1 currently");
    let refusal = server.requests().into_iter().rev().find(|r| r.path.ends_with("/t1/eviction")).unwrap();
    assert_eq!(refusal.status, 429);
    assert!(server.get("pod", "default", "t1").is_some());
    // Once another matching pod is Ready, the budget allows it again.
    server.set_pod_ready("default", "t2", true);
    assert_eq!(pdbs.get("train").await.unwrap().status.unwrap().disruptions_allowed, Some(1));
    pods.evict("t1", &EvictParams::default()).await.unwrap();
    assert!(server.get("pod", "default", "t1").is_none());
    // Pods no budget covers, and pending pods, are evicted freely.
    server.create(pod("default", "free", json!({"app": "other"}), Some("n1")));
    server.set_pod_phase("default", "free", "Running");
    pods.evict("free", &EvictParams::default()).await.unwrap();
    assert_eq!(api_code(&pods.evict("gone", &EvictParams::default()).await.unwrap_err()).0, 404);

    // Percentages need the scale of the pods' controllers: with bare pods the disruption
    // controller fails safe and the new generation stays unobserved.
    server.create(pod("default", "t3", json!({"app": "train"}), Some("n1")));
    server.set_pod_phase("default", "t3", "Running");
    pdbs.patch("train", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": "50%"}})))
        .await
        .unwrap();
    let st = pdbs.get("train").await.unwrap().status.unwrap();
    assert_eq!((st.disruptions_allowed, st.observed_generation), (Some(0), Some(1)));
    assert_eq!(st.conditions.as_ref().unwrap()[0].reason, "SyncFailed");
    let err = pods.evict("t2", &EvictParams::default()).await.unwrap_err();
    let kube::Error::Api(s) = &err else { panic!("{err:?}") };
    assert_eq!(s.code, 429);
    assert!(s.details.as_ref().unwrap().causes[0].message.contains("still being processed"), "{s:?}");
    // Owned by a ReplicaSet of a 2-replica Deployment: expected 2, 50% rounds up to 1.
    let dep = server
        .create(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train"},
                                   "spec": {"replicas": 2}}));
    let rs =
        server.create(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "train-1",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "train",
                             "uid": dep["metadata"]["uid"], "controller": true}]}, "spec": {"replicas": 2}}));
    for p in ["t2", "t3"] {
        server.update("pod", "default", p, |o| {
            o["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "train-1", "uid": rs["metadata"]["uid"], "controller": true}]);
        });
    }
    let st = pdbs.get("train").await.unwrap().status.unwrap();
    assert_eq!(
        (st.expected_pods, st.desired_healthy, st.current_healthy, st.disruptions_allowed),
        (Some(2), Some(1), Some(2), Some(1))
    );
    assert_eq!(st.observed_generation, Some(2));
    pods.evict("t2", &EvictParams::default()).await.unwrap();
    // The scale still says 2 while the replacement is missing: no further disruption.
    let st = pdbs.get("train").await.unwrap().status.unwrap();
    assert_eq!((st.expected_pods, st.current_healthy, st.disruptions_allowed), (Some(2), Some(1), Some(0)));
    assert_eq!(api_code(&pods.evict("t3", &EvictParams::default()).await.unwrap_err()).0, 429);
    // A second budget over the same pods is a 500 like the real server.
    server.create(pdb("second", json!(0)));
    assert_eq!(api_code(&pods.evict("t3", &EvictParams::default()).await.unwrap_err()).0, 500);
}

#[tokio::test]
async fn graceful_pod_deletion_and_eviction() {
    let server = FakeApiServer::start_with(Settings {
        graceful_pod_deletion: true,
        max_grace_period: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    server.create(pod("default", "g", json!({"app": "train"}), Some("n1")));
    server.set_pod_phase("default", "g", "Running");
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let deleted = pods.delete("g", &DeleteParams::default()).await.unwrap();
    let terminating = deleted.left().expect("a terminating pod is returned");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    assert!(server.get("pod", "default", "g").is_some(), "the pod stays during its grace period");
    server
        .wait_until(WAIT, "the pod to disappear after its grace period", |s| {
            s.get("pod", "default", "g").is_none()
        })
        .await;

    // Grace period 0 and unscheduled pods go at once.
    server.create(pod("default", "now", json!({}), Some("n1")));
    server.set_pod_phase("default", "now", "Running");
    pods.delete("now", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    assert!(server.get("pod", "default", "now").is_none());

    // Eviction in graceful mode: the pod terminates, stops counting as healthy, then goes.
    server.create(pod("default", "e1", json!({"app": "train"}), Some("n1")));
    server.create(pod("default", "e2", json!({"app": "train"}), Some("n1")));
    server.set_pod_phase("default", "e1", "Running");
    server.set_pod_phase("default", "e2", "Running");
    server.create(pdb("train", json!(1)));
    pods.evict("e1", &EvictParams::default()).await.unwrap();
    let e1 = server.get("pod", "default", "e1").expect("terminating");
    assert!(e1["metadata"]["deletionTimestamp"].is_string());
    let st = server.get("pdb", "default", "train").unwrap()["status"].clone();
    assert_eq!((st["currentHealthy"].as_i64(), st["disruptionsAllowed"].as_i64()), (Some(1), Some(0)));
    assert_eq!(api_code(&pods.evict("e2", &EvictParams::default()).await.unwrap_err()).0, 429);
    server.wait_until(WAIT, "the evicted pod to go", |s| s.get("pod", "default", "e1").is_none()).await;
}

#[tokio::test]
async fn fault_injection_and_request_log() {
    let server = FakeApiServer::start().await;
    server.create(node("n1"));
    let nodes: Api<Node> = Api::all(server.replica_client("r1"));
    server.fail_next("PATCH", "/api/v1/nodes/n1", 500, 2);
    server.inject_fault(Fault::new("*", "/api/v1/nodes", 429, 1).retry_after(1).message("slow down"));
    // The 429 fault was added last but both match a PATCH: faults apply in insertion order.
    let patch = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    assert_eq!(
        api_code(&nodes.patch("n1", &PatchParams::default(), &patch).await.unwrap_err()),
        (500, "InternalError".into())
    );
    assert_eq!(api_code(&nodes.patch("n1", &PatchParams::default(), &patch).await.unwrap_err()).0, 500);
    let err = nodes.get("n1").await.unwrap_err();
    let kube::Error::Api(s) = &err else { panic!("{err:?}") };
    assert_eq!((s.code, s.reason.as_str(), s.message.as_str()), (429, "TooManyRequests", "slow down"));
    assert!(server.pending_faults().is_empty());
    nodes.patch("n1", &PatchParams::default(), &patch).await.unwrap();
    let log = server.requests();
    let codes: Vec<(String, u16)> = log.iter().map(|r| (r.method.clone(), r.status)).collect();
    assert_eq!(
        codes,
        [("PATCH".into(), 500), ("PATCH".into(), 500), ("GET".into(), 429), ("PATCH".into(), 200)]
    );
    assert!(log.iter().all(|r| r.replica.as_deref() == Some("r1")));
    assert_eq!(log[0].content_type.as_deref(), Some("application/merge-patch+json"));
    assert!(log[0].body.contains("unschedulable"));
}

#[tokio::test]
async fn binding_assigns_pods_and_deleting_a_node_collects_its_pods() {
    let server = FakeApiServer::start().await;
    server.create(node("n1"));
    server.create(pod("default", "b", json!({}), None));
    server.create(pod("default", "elsewhere", json!({}), Some("n2")));
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "b"},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}});
    let ok: kube::core::Status =
        pods.create_subresource("binding", "b", &PostParams::default(), &binding).await.unwrap();
    assert_eq!(ok.code, 201);
    let bound = pods.get("b").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("n1"));
    let scheduled = bound.status.unwrap().conditions.unwrap();
    assert!(scheduled.iter().any(|c| c.type_ == "PodScheduled" && c.status == "True"));
    let again = pods
        .create_subresource::<_, kube::core::Status>("binding", "b", &PostParams::default(), &binding)
        .await
        .unwrap_err();
    assert_eq!(api_code(&again), (409, "Conflict".into()));
    // POST on the all-namespaces path is not allowed.
    let all: Api<Pod> = Api::all(server.client());
    let p: Pod = serde_json::from_value(pod("default", "x", json!({}), None)).unwrap();
    assert_eq!(api_code(&all.create(&PostParams::default(), &p).await.unwrap_err()).0, 405);

    Api::<Node>::all(server.client()).delete("n1", &DeleteParams::default()).await.unwrap();
    assert!(server.get("pod", "default", "b").is_none(), "pods of a deleted node are collected");
    assert!(server.get("pod", "default", "elsewhere").is_some());
}

#[tokio::test]
async fn streaming_list_watcher_converges() {
    let server = FakeApiServer::start().await;
    for i in 0..3 {
        server.create(pod("default", &format!("s{i}"), json!({"app": "s"}), None));
    }
    let api: Api<Pod> = Api::all(server.client());
    let (reader, writer) = reflector::store::<Pod>();
    let cfg = watcher::Config::default().streaming_lists();
    let task = tokio::spawn(reflector(writer, watcher(api, cfg)).default_backoff().for_each(|_| async {}));
    tokio::time::timeout(WAIT, reader.wait_until_ready()).await.expect("streaming list ready").unwrap();
    converge(&server, &reader, "streaming initial events").await;
    server.create(pod("default", "s9", json!({}), None));
    server.delete("pods", "default", "s0").unwrap();
    converge(&server, &reader, "streaming live events").await;
    assert!(server.requests().iter().any(|r| r.param("sendInitialEvents").as_deref() == Some("true")));
    task.abort();
}

#[tokio::test]
async fn podgroups_are_served_as_a_custom_resource() {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let server = FakeApiServer::start().await;
    let gvk = GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "podgroups");
    let api: Api<DynamicObject> = Api::namespaced_with(server.client(), "default", &ar);
    let mut pg = DynamicObject::new("train", &ar);
    pg.data = json!({"spec": {"minMember": 4}, "status": {"phase": "Ignored"}});
    let created = api.create(&PostParams::default(), &pg).await.unwrap();
    assert!(created.data.get("status").is_none(), "status is dropped on create with a status subresource");
    let st = json!({"status": {"phase": "Running", "running": 4}});
    api.patch_status("train", &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.items[0].types.as_ref().map(|t| t.kind.as_str()),
        Some("PodGroup"),
        "CR list items keep kind"
    );
    assert_eq!(list.items[0].data["status"]["phase"], "Running");
    let smp = api
        .patch("train", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"minMember": 2}})))
        .await;
    assert_eq!(api_code(&smp.unwrap_err()).0, 415, "custom resources refuse strategic merge patch");
    let raw = server.get("podgroup", "default", "train").unwrap();
    assert_eq!(raw["spec"]["minMember"], 4);
}

#[tokio::test]
async fn shutdown_ends_watches_and_refuses_connections() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    api.list(&ListParams::default()).await.unwrap();
    let mut stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    server.shutdown().await;
    tokio::time::timeout(WAIT, async { while stream.next().await.is_some() {} })
        .await
        .expect("the watch ends");
    assert!(api.list(&ListParams::default()).await.is_err(), "a stopped server answers nothing");
}

#[tokio::test]
async fn events_written_through_either_api_are_one_store() {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = FakeApiServer::start().await;
    server.create(node("n1"));
    let client = server.client();
    let reporter = Reporter { controller: "gpuscale".into(), instance: Some("replica-a".into()) };
    let recorder = Recorder::new(client.clone(), reporter);
    let reference = ObjectReference {
        kind: Some("Node".into()),
        name: Some("n1".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "Cordoned".into(),
        note: Some("draining for scale-down".into()),
        action: "Drain".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    // The second identical event becomes a series (a merge patch of the same object).
    recorder.publish(&ev, &reference).await.unwrap();

    let new_api: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let new = new_api.list(&ListParams::default().fields("regarding.name=n1")).await.unwrap();
    assert_eq!(new.items.len(), 1);
    assert_eq!(new.items[0].note.as_deref(), Some("draining for scale-down"));
    assert_eq!(new.items[0].series.as_ref().map(|s| s.count), Some(2));
    let core_api: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let core =
        core_api.list(&ListParams::default().fields("involvedObject.name=n1,reason=Cordoned")).await.unwrap();
    assert_eq!(core.items.len(), 1);
    assert_eq!(core.items[0].message.as_deref(), Some("draining for scale-down"));
    assert_eq!(core.items[0].reporting_component.as_deref(), Some("gpuscale"));
    assert_eq!(core.items[0].involved_object.kind.as_deref(), Some("Node"));
    let stored = server.list("events.k8s.io", Some("default"));
    assert_eq!(stored[0]["regarding"]["name"], "n1");
    assert_eq!(server.list("Event", Some("default"))[0]["involvedObject"]["name"], "n1");
}

#[tokio::test]
async fn dry_run_keeps_nothing_and_eviction_delete_options_are_dropped_like_the_real_server() {
    let server = FakeApiServer::start_with(Settings {
        graceful_pod_deletion: true,
        max_grace_period: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    server.create(pod("default", "d1", json!({"app": "train"}), Some("n1")));
    server.set_pod_phase("default", "d1", "Running");
    server.create(pdb("train", json!(1)));
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let dry = EvictParams {
        post_options: PostParams { dry_run: true, ..Default::default() },
        ..Default::default()
    };
    assert_eq!(
        api_code(&pods.evict("d1", &dry).await.unwrap_err()).0,
        429,
        "a dry run answers the real refusal"
    );
    server.create(pod("default", "d2", json!({"app": "train"}), Some("n1")));
    server.set_pod_phase("default", "d2", "Running");
    let rv = server.resource_version();
    pods.evict("d1", &dry).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dry"}})).unwrap();
    cms.create(&PostParams { dry_run: true, ..Default::default() }, &cm).await.unwrap();
    assert_eq!(server.resource_version(), rv, "dry runs write nothing");
    assert!(server.get("pod", "default", "d1").unwrap()["metadata"]["deletionTimestamp"].is_null());
    assert!(server.get("configmap", "default", "dry").is_none());

    // kube 5 serializes EvictParams::delete_options as `delete_options`; the API server does
    // not know that field and drops it, so the pod gets its own grace period, not 0.
    let ep = EvictParams {
        delete_options: Some(DeleteParams { grace_period_seconds: Some(0), ..Default::default() }),
        ..Default::default()
    };
    pods.evict("d1", &ep).await.unwrap();
    let d1 = server.get("pod", "default", "d1").expect("terminating, not gone");
    assert_eq!(d1["metadata"]["deletionGracePeriodSeconds"], 30);
    let sent = server.requests().into_iter().rev().find(|r| r.path.ends_with("/d1/eviction")).unwrap();
    assert!(sent.body.contains("delete_options"), "{}", sent.body);
}

#[tokio::test]
async fn the_production_client_retries_transient_errors_inside_kube() {
    let server = FakeApiServer::start().await;
    server.create(node("n1"));
    server.fail_next("GET", "/api/v1/nodes/n1", 503, 2);
    let nodes: Api<Node> = Api::all(server.client_with_retries());
    assert_eq!(nodes.get("n1").await.unwrap().name_any(), "n1");
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 503, 200], "kube's default retry hides two 503s");
    // The test client does not retry: the caller sees the error.
    server.fail_next("GET", "/api/v1/nodes/n1", 503, 1);
    let plain: Api<Node> = Api::all(server.client());
    assert_eq!(api_code(&plain.get("n1").await.unwrap_err()).0, 503);
}
