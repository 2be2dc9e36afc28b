//! Every example snapshot and well-formed test fixture is something a real API server accepts:
//! each object goes through kube-apiserver's validation and admission with a server-side dry run
//! (`?dryRun=All`, nothing stored). A fixture a real cluster could never hold (a label value with
//! spaces, a bad name) would make our plans about clusters that cannot exist.

use crate::controlplane;
use crate::provisioning_crd;

use controlplane::{ControlPlane, Options};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The snapshot files: the examples and the well-formed test fixtures (`malformed/` is bad on
/// purpose).
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut stack = vec![root.join("examples/snapshots"), root.join("tests/data/snapshots")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "malformed") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "json" || x == "yaml" || x == "yml") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_and_fixture_object_passes_the_real_api_servers_validation() {
    let files = fixtures();
    assert!(files.len() >= 5, "fixtures found: {files:?}");
    let cp = ControlPlane::start(Options { scheduler: false, ..Default::default() }).await;
    // ProvisioningRequests are checked against their CRD's schema.
    provisioning_crd::install(&cp).await;
    let mut rejected = Vec::new();
    let mut checked = 0;
    let mut skipped = Vec::new();
    let mut namespaces = BTreeSet::new();
    let mut classes = BTreeSet::new();
    for file in &files {
        let mut warnings = Vec::new();
        let objects = gpuscale::k8s::read_path(file, &mut warnings).unwrap_or_else(|e| panic!("{e}"));
        for o in objects {
            let mut v = o.value.clone();
            if let Some(ns) = v["metadata"]["namespace"].as_str() {
                if namespaces.insert(ns.to_string()) {
                    cp.ensure_namespace(ns).await;
                }
            }
            // Priority classes are cluster objects snapshots leave out; the admission plugin
            // needs the one a pod names, with the value the pod was admitted with.
            if let Some(class) = v["spec"]["priorityClassName"].as_str() {
                if classes.insert(class.to_string()) && !class.starts_with("system-") {
                    cp.apply(serde_json::json!({
                        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": class}, "value": v["spec"]["priority"].as_i64().unwrap_or(0),
                    }))
                    .await;
                }
            }
            // What the server sets itself is not the fixture's to give.
            if let Some(m) = v["metadata"].as_object_mut() {
                for k in ["resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"] {
                    m.remove(k);
                }
            }
            // A Service's cluster IP belongs to the cluster it was exported from.
            if v["kind"] == "Service" {
                if let Some(spec) = v["spec"].as_object_mut() {
                    spec.remove("clusterIP");
                    spec.remove("clusterIPs");
                }
            }
            let path = controlplane::object_path(&v);
            let collection = path.rsplit_once('/').unwrap().0.to_string();
            match cp.raw("POST", &format!("{collection}?dryRun=All"), Some(v)).await {
                Ok(_) => checked += 1,
                Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 => {
                    rejected.push(format!("{}: {} {}", o.origin, e.code, e.message));
                }
                // A custom resource whose CRD this bare control plane does not have.
                Err(kube::Error::Api(e)) if e.code == 404 && !path.starts_with("/api/") => {
                    skipped.push(o.origin.clone())
                }
                Err(e) => panic!("{}: {e}", o.origin),
            }
        }
    }
    println!(
        "{checked} objects from {} files accepted by kube-apiserver; {} custom resources not checked: {skipped:?}",
        files.len(),
        skipped.len()
    );
    assert!(rejected.is_empty(), "a real API server rejects:\n{}", rejected.join("\n"));
}
