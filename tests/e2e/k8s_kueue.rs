//! Kueue's ProvisioningRequest admission check admitting a workload through gpuscale, on the real
//! control plane: Kueue's manager (`sigs.k8s.io/kueue`, built from the Go module proxy by
//! `scripts/kueue.sh`) with its CRDs, the ProvisioningRequest CRD, gpuscale's controller and the
//! simulated cloud. Kueue's pod integration manages a plain Pod: it is created as Kueue's
//! mutating webhook would leave it (queue label, managed label, finalizer, admission scheduling
//! gate; no webhook is registered, so the API server never calls Kueue), Kueue creates its
//! Workload, reserves quota, asks gpuscale for the capacity with a ProvisioningRequest, admits the
//! Workload once it is Provisioned, and ungates the pod with the consume annotation; kube-scheduler
//! binds it onto the node gpuscale added.

use crate::controlplane;
use crate::kube_cluster;
use crate::provisioning_crd;

use crate::kueue::start_kueue;
use controlplane::Options;
use gpuscale::planner::PlannerSettings;
use kube_cluster::{fast_config, node_name, pod_json, KubeCluster};
use serde_json::{json, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);

const PROVIDERS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 20, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 7}
    nodeGroups:
      - {name: gpu-h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_a_gpu_workload_through_a_provisioning_request_gpuscale_provisions() {
    let c = KubeCluster::start(PROVIDERS, Options::default()).await;
    provisioning_crd::install(&c.cp).await;
    let mut kueue = start_kueue(&c).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let gpuscale = c.controller("a", fast_config(), PlannerSettings::default(), false).await;

    // The queues, as Kueue's docs set up a ProvisioningRequest admission check.
    for obj in [
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}, "spec": {}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ProvisioningRequestConfig", "metadata": {"name": "dws"},
               "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                        "managedResources": ["nvidia.com/gpu"]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": "dws-prov"},
               "spec": {"controllerName": "kueue.x-k8s.io/provisioning-request",
                        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "dws"}}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "gpus"},
               "spec": {"namespaceSelector": {},
                        "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [{"name": "default", "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "10Ti"},
                                {"name": "nvidia.com/gpu", "nominalQuota": "64"}]}]}],
                        "admissionChecksStrategy": {"admissionChecks": [{"name": "dws-prov"}]}}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "queue", "namespace": "ml"},
               "spec": {"clusterQueue": "gpus"}}),
    ] {
        c.create(obj).await;
    }
    // A pod as Kueue's pod webhook leaves it: managed, queued, gated, with Kueue's finalizer.
    let mut pod = pod_json("ml", "train-0", 8, None, None);
    pod["metadata"]["labels"] =
        json!({"kueue.x-k8s.io/queue-name": "queue", "kueue.x-k8s.io/managed": "true"});
    pod["metadata"]["finalizers"] = json!(["kueue.x-k8s.io/managed"]);
    pod["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
    c.create(pod).await;

    tokio::time::sleep(Duration::from_secs(3)).await;
    kueue.assert_running();
    // Kueue asks for the capacity; gpuscale provisions it (one node, once).
    let requests = "/apis/autoscaling.x-k8s.io/v1/namespaces/ml/provisioningrequests";
    let provisioned = || async {
        let list = c.get(requests).await.unwrap_or_default();
        list["items"].as_array().is_some_and(|items| {
            items.iter().any(|r| {
                r["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Provisioned" && c["status"] == "True"))
            })
        })
    };
    let began = std::time::Instant::now();
    while !provisioned().await {
        if began.elapsed() > WAIT {
            let show =
                |v: Option<Value>| serde_json::to_string_pretty(&v.unwrap_or_default()).unwrap_or_default();
            eprintln!("provisioningrequests: {}", show(c.get(requests).await));
            eprintln!(
                "workloads: {}",
                show(c.get("/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads").await)
            );
            eprintln!(
                "admissionchecks: {}",
                show(c.get("/apis/kueue.x-k8s.io/v1beta2/admissionchecks").await)
            );
            eprintln!("podtemplates: {}", show(c.get("/api/v1/namespaces/ml/podtemplates").await));
            if let Some((plan, _)) = gpuscale.recorder.last_plan.lock().unwrap().clone() {
                eprintln!("gpuscale's last plan:\n{}", plan.to_table());
            }
            panic!("timed out waiting for Kueue's ProvisioningRequest provisioned by gpuscale");
        }
        kueue.assert_running();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Kueue admits the workload and ungates the pod; kube-scheduler binds it onto the new node.
    c.wait_until(WAIT, "the pod running", || async { c.running_on("train-0").await.is_some() }).await;
    let live = c.live_instances("gpu-h100");
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(c.running_on("train-0").await.unwrap(), node_name(&live[0]));
    let pod = c.pod("train-0").await.unwrap();
    let request = pod["metadata"]["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"].clone();
    let list = c.get(requests).await.unwrap();
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().filter_map(|r| r["metadata"]["name"].as_str()).collect();
    assert!(
        request.as_str().is_some_and(|r| names.contains(&r)),
        "consume annotation {request} of {names:?}"
    );
    let workloads = c.get("/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads").await.unwrap();
    let admitted = workloads["items"].as_array().unwrap().iter().any(|w| {
        w["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Admitted" && c["status"] == "True"))
    });
    assert!(admitted, "{workloads:#}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 1)], "the gated pod and its request scaled once");
    gpuscale.shutdown().await.unwrap();
    driver.abort();
    drop(kueue);
    c.assert_rbac_allowed("a");
}
