//! Kueue's manager (`sigs.k8s.io/kueue`, built from the Go module proxy by `scripts/kueue.sh`) on
//! the real control plane: its CRDs installed, the manager run as the cluster admin with its pod
//! integration only. No webhook is registered, so the API server never calls Kueue: pods are
//! created as its mutating webhook would leave them.
#![allow(dead_code)]

use crate::kube_cluster::KubeCluster;
use crate::provisioning_crd;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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
pub struct Kueue {
    child: Child,
    log: PathBuf,
}

impl Kueue {
    /// Panics if the manager has exited.
    pub fn assert_running(&mut self) {
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
pub async fn start_kueue(c: &KubeCluster) -> Kueue {
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
