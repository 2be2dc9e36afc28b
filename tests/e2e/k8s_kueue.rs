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

use controlplane::Options;
use gpuscale::planner::PlannerSettings;
use kube_cluster::{fast_config, node_name, pod_json, KubeCluster};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

/// The Kueue manager binary: `GPUSCALE_KUEUE_BIN` (set by `scripts/test.sh`) or `scripts/kueue.sh`.
fn kueue_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUSCALE_KUEUE_BIN") {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kueue.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed: Kueue could not be built", script.display());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Kueue's module folder (its CRDs), from the version tests/k8s/kueue/go.mod pins.
fn kueue_module() -> PathBuf {
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s/kueue");
    let out = Command::new("go")
        .args(["list", "-m", "-json", "sigs.k8s.io/kueue"])
        .current_dir(&module)
        .output()
        .unwrap_or_else(|e| panic!("cannot run go: {e}"));
    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("go list -m sigs.k8s.io/kueue: {e}: {}", String::from_utf8_lossy(&out.stderr))
    });
    let dir = info["Dir"].as_str().map(PathBuf::from);
    dir.unwrap_or_else(|| {
        let dl = Command::new("go")
            .args(["mod", "download", "-json", "sigs.k8s.io/kueue"])
            .current_dir(&module)
            .output()
            .expect("go mod download");
        let info: Value = serde_json::from_slice(&dl.stdout).expect("go mod download -json");
        PathBuf::from(info["Dir"].as_str().unwrap_or_else(|| panic!("no Kueue module: {info}")))
    })
}

/// Kueue's manager, killed when dropped; its log is printed then.
struct Kueue {
    child: Child,
    log: PathBuf,
}

impl Kueue {
    /// Panics if the manager has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("Kueue exited ({status}); see its log below");
        }
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- Kueue log (last 60 lines) ---");
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Installs Kueue's CRDs and starts its manager as the cluster admin, pod integration only.
async fn start_kueue(c: &KubeCluster) -> Kueue {
    let bases = kueue_module().join("config/components/crd/bases");
    for e in std::fs::read_dir(&bases).unwrap_or_else(|e| panic!("{}: {e}", bases.display())) {
        let path = e.unwrap().path();
        let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        provisioning_crd::install_crd(&c.cp, crd).await;
    }
    c.cp.ensure_namespace("kueue-system").await;
    let dir = c.cp.dir().join("kueue");
    std::fs::create_dir_all(&dir).unwrap();
    // The webhook server needs a certificate even though no webhook is registered.
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kueue"])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl could not make the webhook certificate");
    let config = format!(
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\nnamespace: kueue-system\n\
         health: {{healthProbeBindAddress: \"127.0.0.1:{health}\"}}\nmetrics: {{bindAddress: \"0\"}}\n\
         webhook: {{port: {webhook}, host: 127.0.0.1, certDir: {dir}}}\nleaderElection: {{leaderElect: false}}\n\
         internalCertManagement: {{enable: false}}\nintegrations: {{frameworks: [pod]}}\n",
        health = free_port(),
        webhook = free_port(),
        dir = dir.display()
    );
    std::fs::write(dir.join("config.yaml"), config).unwrap();
    let log = dir.join("kueue.log");
    let out = std::fs::File::create(&log).unwrap();
    // Kueue reads the metrics server's certificate from a fixed path, /etc/kueue/metrics/certs,
    // when it does not manage certificates itself: it runs in a private mount namespace whose
    // /etc is an empty tmpfs holding just that (a static binary talking to an IP needs nothing
    // else from /etc), so the test writes nothing outside its folder.
    let script = format!(
        "mount -t tmpfs none /etc && mkdir -p /etc/kueue/metrics/certs && \\
         cp {dir}/tls.crt {dir}/tls.key /etc/kueue/metrics/certs/ && exec \"$@\"",
        dir = dir.display()
    );
    let child = Command::new("unshare")
        .args(["--map-root-user", "--mount", "sh", "-c", &script, "kueue"])
        .arg(kueue_binary())
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("--kubeconfig")
        .arg(&c.cp.admin_kubeconfig)
        .arg(format!("--visibility-server-port={}", free_port()))
        .arg("--feature-gates=VisibilityOnDemand=false")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start Kueue (unshare)");
    Kueue { child, log }
}

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
