//! A real Kubernetes control plane for integration tests: etcd, kube-apiserver, kube-scheduler and
//! (for tests that need some of its controllers) kube-controller-manager, built from the official
//! Go modules by `scripts/k8s-controlplane.sh`, run on loopback ports in a
//! temporary folder, torn down (every process killed and reaped) when the value is dropped, also
//! on panic.
//!
//! The API server runs with RBAC authorization, service-account tokens (signed with a key made
//! here) and an audit log of every request, which is how tests see what the controller asked and
//! what the real authorizer answered. Binaries come from `GPUSCALE_K8S_BIN` (set by
//! `scripts/test.sh`) or, failing that, from running the build script; a test that cannot get
//! them fails and says why.
#![allow(dead_code)]

use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How to start the control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Start kube-scheduler too.
    pub scheduler: bool,
    /// kube-apiserver `--max-requests-inflight` (0: the server's default, 400).
    pub max_requests_inflight: u32,
    /// Serve watches from the API server's watch cache (the default); off sends them to etcd,
    /// so an etcd compaction is seen by watchers as `410 Gone`.
    pub watch_cache: bool,
    /// kube-controller-manager's controllers to run (`resourceclaim-controller`,
    /// `replicaset-controller`, ...); none starts no kube-controller-manager.
    pub controllers: Vec<&'static str>,
}

impl Default for Options {
    fn default() -> Self {
        Self { scheduler: true, max_requests_inflight: 0, watch_cache: true, controllers: Vec::new() }
    }
}

/// The folder with `etcd`, `kube-apiserver`, `kube-scheduler` and `kube-controller-manager`.
pub fn binaries() -> PathBuf {
    static DIR: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut dir = DIR.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = dir.as_ref() {
        return d.clone();
    }
    let found = match std::env::var_os("GPUSCALE_K8S_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/k8s-controlplane.sh");
            eprintln!("controlplane: GPUSCALE_K8S_BIN unset; running {}", script.display());
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "{} failed: the control plane could not be built",
                script.display()
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    for b in ["etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"] {
        assert!(
            found.join(b).is_file(),
            "no {b} in {} (GPUSCALE_K8S_BIN or scripts/k8s-controlplane.sh)",
            found.display()
        );
    }
    *dir = Some(found.clone());
    found
}

/// A free loopback port (bound, then released for the process to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A child process that is killed when its parent (this test's thread) dies, even by SIGKILL.
fn spawn(bin: &Path, args: &[String], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The last lines of a log, for failure messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A client of a component's HTTPS port that skips certificate checks (only for health probes).
fn insecure_client(url: &str, token: Option<&str>) -> kube::Client {
    let mut c = kube::Config::new(url.parse().unwrap());
    c.accept_invalid_certs = true;
    c.auth_info.token = token.map(|t| t.to_string().into());
    kube::Client::try_from(c).unwrap()
}

/// One plain HTTP/1.1 POST of a JSON body to etcd's gateway; the JSON answer.
fn etcd_post(port: u16, path: &str, body: &Value) -> Value {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to etcd");
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write to etcd");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read from etcd");
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "etcd {path}: {head}\n{rest}");
    // The gateway may answer chunked; the JSON object is between the first '{' and the last '}'.
    let json = &rest[rest.find('{').unwrap_or(0)..=rest.rfind('}').unwrap_or(0)];
    serde_json::from_str(json).unwrap_or_else(|e| panic!("etcd {path}: {e}: {rest}"))
}

/// A running control plane.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    etcd: Mutex<Child>,
    apiserver: Mutex<Option<Child>>,
    scheduler: Mutex<Option<Child>>,
    controller_manager: Mutex<Option<Child>>,
    apiserver_args: Vec<String>,
    etcd_port: u16,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// From each API server kill to 10 s after it was ready again: its RBAC authorizer answers
    /// from caches that are still filling, so it refuses allowed requests for a moment.
    pub restarts: Mutex<Vec<(k8s_openapi::jiff::Timestamp, k8s_openapi::jiff::Timestamp)>>,
    /// Admin client (system:masters).
    pub admin: kube::Client,
    /// Path of the admin kubeconfig.
    pub admin_kubeconfig: PathBuf,
    /// Wall time from start to every component ready.
    pub startup: Duration,
}

const ADMIN_TOKEN: &str = "gpuscale-test-admin-token";

impl ControlPlane {
    /// Starts etcd, kube-apiserver and (per `options`) kube-scheduler, and waits until the API
    /// server is ready and the scheduler has started.
    pub async fn start(options: Options) -> Self {
        gpuscale::tls::install_crypto_provider();
        let bin = binaries();
        let began = Instant::now();
        let dir = tempfile::Builder::new().prefix("gpuscale-k8s-").tempdir().expect("temp dir");
        let d = dir.path().to_path_buf();
        let p = |name: &str| d.join(name).to_string_lossy().into_owned();

        let (etcd_port, peer_port) = (free_port(), free_port());
        let etcd = spawn(
            &bin.join("etcd"),
            &[
                "--name=test".into(),
                format!("--data-dir={}", p("etcd")),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=test=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
            &d.join("etcd.log"),
        );

        // The service-account signing key, the admin's static token and the audit policy.
        let key = d.join("sa.key");
        let status = Command::new("openssl")
            .args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"])
            .arg(&key)
            .status()
            .expect("openssl is needed to make the service-account signing key");
        assert!(status.success(), "openssl ecparam failed");
        std::fs::write(d.join("tokens.csv"), format!("{ADMIN_TOKEN},admin,admin-uid,system:masters\n"))
            .unwrap();
        std::fs::write(
            d.join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n",
        )
        .unwrap();

        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", p("certs")),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", key.display()),
            format!("--service-account-signing-key-file={}", key.display()),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        if options.max_requests_inflight > 0 {
            apiserver_args.push(format!("--max-requests-inflight={}", options.max_requests_inflight));
            apiserver_args
                .push(format!("--max-mutating-requests-inflight={}", options.max_requests_inflight));
            apiserver_args.push("--enable-priority-and-fairness=false".into());
        }
        if !options.watch_cache {
            apiserver_args.push("--watch-cache=false".into());
        }
        let apiserver = spawn(&bin.join("kube-apiserver"), &apiserver_args, &d.join("kube-apiserver.log"));

        let admin_kubeconfig = d.join("admin.kubeconfig");
        let mut me = Self {
            dir,
            etcd: Mutex::new(etcd),
            apiserver: Mutex::new(Some(apiserver)),
            scheduler: Mutex::new(None),
            controller_manager: Mutex::new(None),
            apiserver_args,
            etcd_port,
            admin: kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap(),
            admin_kubeconfig: admin_kubeconfig.clone(),
            url,
            restarts: Mutex::new(Vec::new()),
            startup: Duration::ZERO,
        };
        me.wait_ready(Duration::from_secs(120)).await;
        std::fs::write(&admin_kubeconfig, me.kubeconfig("admin", ADMIN_TOKEN)).unwrap();
        me.admin = me.client_from(&admin_kubeconfig, false).await;

        if options.scheduler {
            let config = d.join("scheduler.yaml");
            std::fs::write(
                &config,
                format!(
                    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                     clientConnection:\n  kubeconfig: {}\n  qps: 200\n  burst: 400\n\
                     leaderElection:\n  leaderElect: false\n",
                    admin_kubeconfig.display()
                ),
            )
            .unwrap();
            let sched_port = free_port();
            let sched = spawn(
                &bin.join("kube-scheduler"),
                &[
                    format!("--config={}", config.display()),
                    format!("--secure-port={sched_port}"),
                    "--bind-address=127.0.0.1".into(),
                    "--v=1".into(),
                ],
                &d.join("kube-scheduler.log"),
            );
            *me.scheduler.lock().unwrap() = Some(sched);
            me.wait_healthy("kube-scheduler", &me.scheduler, sched_port, "/readyz").await;
        }
        if !options.controllers.is_empty() {
            let kcm_port = free_port();
            let kcm = spawn(
                &bin.join("kube-controller-manager"),
                &[
                    format!("--kubeconfig={}", admin_kubeconfig.display()),
                    format!("--controllers={}", options.controllers.join(",")),
                    "--leader-elect=false".into(),
                    format!("--secure-port={kcm_port}"),
                    "--bind-address=127.0.0.1".into(),
                    format!("--cert-dir={}", p("kcm-certs")),
                    "--kube-api-qps=200".into(),
                    "--kube-api-burst=400".into(),
                    "--v=1".into(),
                ],
                &d.join("kube-controller-manager.log"),
            );
            *me.controller_manager.lock().unwrap() = Some(kcm);
            me.wait_healthy("kube-controller-manager", &me.controller_manager, kcm_port, "/healthz").await;
        }
        me.startup = began.elapsed();
        eprintln!(
            "controlplane: etcd, kube-apiserver{}{} ready in {:.1} s at {}",
            if options.scheduler { ", kube-scheduler" } else { "" },
            if options.controllers.is_empty() { "" } else { ", kube-controller-manager" },
            me.startup.as_secs_f64(),
            me.url
        );
        me
    }

    /// The temporary folder (logs, kubeconfigs, audit log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kubeconfig for `user` authenticating with `token`, trusting the server's certificate.
    pub fn kubeconfig(&self, user: &str, token: &str) -> String {
        let ca =
            std::fs::read(self.dir.path().join("certs/apiserver.crt")).expect("the API server's certificate");
        let ca = base64::engine::general_purpose::STANDARD.encode(&ca);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: {user}@test\n  context:\n    cluster: test\n    user: {user}\n\
             current-context: {user}@test\n",
            url = self.url
        )
    }

    /// A client built from the kubeconfig at `path`: as `gpuscale run` builds it (no built-in
    /// retries) for the controller, with kube's retries for the harness.
    pub async fn client_from(&self, path: &Path, controller: bool) -> kube::Client {
        let kc = Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if controller {
            gpuscale::controller::client(config).expect("kube client")
        } else {
            kube::Client::try_from(config).expect("kube client")
        }
    }

    /// Creates ServiceAccount `ns/name` (and its namespace) and returns a kubeconfig path and a
    /// controller client authenticating with a token the API server issued for it (TokenRequest).
    pub async fn service_account(&self, ns: &str, name: &str) -> (PathBuf, kube::Client) {
        self.ensure_namespace(ns).await;
        self.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}))
            .await;
        let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}});
        let resp = self
            .raw("POST", &format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"), Some(req))
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{name}: {e}"));
        let token = resp["status"]["token"].as_str().expect("a token").to_string();
        let path = self.dir.path().join(format!("{ns}-{name}.kubeconfig"));
        std::fs::write(&path, self.kubeconfig(&format!("{ns}-{name}"), &token)).unwrap();
        let client = self.client_from(&path, true).await;
        (path, client)
    }

    /// Creates namespace `ns` and its `default` ServiceAccount (what the controller manager's
    /// service-account controller would), unless they exist.
    pub async fn ensure_namespace(&self, ns: &str) {
        self.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await;
        self.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}))
            .await;
    }

    /// Server-side applies `obj` as the admin (field manager `test`, forced).
    pub async fn apply(&self, obj: Value) -> Value {
        let path = object_path(&obj);
        let request = http::Request::builder()
            .method("PATCH")
            .uri(format!("{path}?fieldManager=test&force=true"))
            .header("Content-Type", "application/apply-patch+yaml")
            .body(serde_json::to_vec(&obj).unwrap())
            .unwrap();
        self.admin.request::<Value>(request).await.unwrap_or_else(|e| panic!("apply {path}: {e}"))
    }

    /// A raw request as the admin; the decoded JSON answer or the error.
    pub async fn raw(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, kube::Error> {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", "application/json")
            .body(body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default())
            .unwrap();
        self.admin.request::<Value>(request).await
    }

    /// A JSON merge patch of the object at `path` as the admin.
    pub async fn raw_patch(&self, path: &str, patch: &Value) -> Value {
        let request = http::Request::builder()
            .method("PATCH")
            .uri(path)
            .header("Content-Type", "application/merge-patch+json")
            .body(serde_json::to_vec(patch).unwrap())
            .unwrap();
        self.admin.request::<Value>(request).await.unwrap_or_else(|e| panic!("patch {path}: {e}"))
    }

    async fn wait_ready(&self, limit: Duration) {
        let began = Instant::now();
        let insecure = insecure_client(&self.url, Some(ADMIN_TOKEN));
        loop {
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            if insecure.request_text(req).await.is_ok_and(|t| t.trim() == "ok") {
                return;
            }
            let exited = self.apiserver.lock().unwrap().as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(code) = exited {
                panic!(
                    "kube-apiserver exited ({code}):\n{}",
                    tail(&self.dir.path().join("kube-apiserver.log"), 40)
                );
            }
            let etcd_exited = self.etcd.lock().unwrap().try_wait().ok().flatten();
            if let Some(code) = etcd_exited {
                panic!("etcd exited ({code}):\n{}", tail(&self.dir.path().join("etcd.log"), 40));
            }
            assert!(
                began.elapsed() < limit,
                "kube-apiserver not ready after {limit:?}:\n{}",
                tail(&self.dir.path().join("kube-apiserver.log"), 40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until component `name` says ok on `path` of its secure port (kube-scheduler's
    /// `/readyz`: its informers are synced; kube-controller-manager's `/healthz`).
    async fn wait_healthy(&self, name: &str, child: &Mutex<Option<Child>>, port: u16, path: &str) {
        let limit = Duration::from_secs(60);
        let began = Instant::now();
        let log = self.dir.path().join(format!("{name}.log"));
        let client = insecure_client(&format!("https://127.0.0.1:{port}"), None);
        loop {
            let req = http::Request::get(path).body(Vec::new()).unwrap();
            if client.request_text(req).await.is_ok_and(|t| t.trim() == "ok") {
                return;
            }
            let exited = child.lock().unwrap().as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(code) = exited {
                panic!("{name} exited ({code}):\n{}", tail(&log, 40));
            }
            assert!(began.elapsed() < limit, "{name} not ready after {limit:?}:\n{}", tail(&log, 40));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills kube-apiserver (as a crash would), waits `down`, starts it again on the same port
    /// and waits until it is ready.
    pub async fn restart_apiserver(&self, down: Duration) {
        let killed = k8s_openapi::jiff::Timestamp::now();
        let old = self.apiserver.lock().unwrap().take();
        if let Some(mut c) = old {
            stop(&mut c);
        }
        tokio::time::sleep(down).await;
        let log = self.dir.path().join("kube-apiserver-restarted.log");
        *self.apiserver.lock().unwrap() =
            Some(spawn(&binaries().join("kube-apiserver"), &self.apiserver_args, &log));
        self.wait_ready(Duration::from_secs(120)).await;
        let settled = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(10);
        self.restarts.lock().unwrap().push((killed, settled));
    }

    /// Whether `e` came in while the API server was restarting or warming up.
    pub fn during_restart(&self, e: &AuditEvent) -> bool {
        let restarts = self.restarts.lock().unwrap();
        e.received.is_some_and(|t| restarts.iter().any(|(from, to)| *from <= t && t <= *to))
    }

    /// Kills kube-apiserver, moves etcd's revision on (a key outside the API's prefix) and
    /// compacts its history while the server is down, then starts it again after `down`: every
    /// watch that resumes from what it last saw gets `410 Gone` and must list again.
    pub async fn restart_apiserver_compacting(&self, down: Duration) {
        let old = self.apiserver.lock().unwrap().take();
        if let Some(mut c) = old {
            stop(&mut c);
        }
        for i in 0..3 {
            let key = base64::engine::general_purpose::STANDARD.encode(format!("/gpuscale-test/tick-{i}"));
            etcd_post(self.etcd_port, "/v3/kv/put", &json!({"key": key, "value": "AA=="}));
        }
        self.compact_etcd();
        self.restart_apiserver(down).await;
    }

    /// Compacts etcd's history up to its current revision (what the API server does every five
    /// minutes), so a watch resumed from an older resource version gets `410 Gone`.
    pub fn compact_etcd(&self) -> u64 {
        let range = etcd_post(self.etcd_port, "/v3/kv/range", &json!({"key": "AA=="}));
        let rev: u64 = range["header"]["revision"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("etcd revision in {range}"));
        etcd_post(
            self.etcd_port,
            "/v3/kv/compaction",
            &json!({"revision": rev.to_string(), "physical": true}),
        );
        rev
    }

    /// Every request the API server has answered, from its audit log.
    pub fn audit(&self) -> Vec<AuditEvent> {
        self.audit_log().iter().filter(|e| answered(e)).map(audit_event).collect()
    }

    /// Every request the API server received and never answered: it was killed while serving
    /// them. Such a request may or may not have taken effect, and no answered record of it exists.
    pub fn unanswered(&self) -> Vec<AuditEvent> {
        let log = self.audit_log();
        let done: std::collections::HashSet<&str> =
            log.iter().filter(|e| answered(e)).filter_map(|e| e["auditID"].as_str()).collect();
        log.iter()
            .filter(|e| e["stage"] == "RequestReceived")
            .filter(|e| e["auditID"].as_str().is_none_or(|id| !done.contains(id)))
            .map(audit_event)
            .collect()
    }

    /// The audit log's records, every stage.
    fn audit_log(&self) -> Vec<Value> {
        let f = match std::fs::File::open(self.dir.path().join("audit.log")) {
            Ok(f) => f,
            Err(_) => return Vec::new(),
        };
        BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect()
    }

    /// The kube-scheduler log so far.
    pub fn scheduler_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-scheduler.log")).unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let unpoison = |m: &mut Mutex<Option<Child>>| m.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut c) = unpoison(&mut self.controller_manager) {
            stop(&mut c);
        }
        if let Some(mut c) = unpoison(&mut self.scheduler) {
            stop(&mut c);
        }
        if let Some(mut c) = unpoison(&mut self.apiserver) {
            stop(&mut c);
        }
        stop(self.etcd.get_mut().unwrap_or_else(|e| e.into_inner()));
        if std::thread::panicking() {
            let keep = self.dir.path().with_extension("kept");
            let _ = std::fs::remove_dir_all(&keep);
            if std::fs::rename(self.dir.path(), &keep).is_ok() {
                eprintln!("controlplane: logs and audit log kept in {}", keep.display());
                let _ = std::fs::create_dir(self.dir.path());
            }
        }
    }
}

/// Whether an audit record is a request's last: answered, or failed in a panic.
fn answered(e: &Value) -> bool {
    e["stage"] == "ResponseComplete" || e["stage"] == "Panic"
}

/// The fields of an audit record tests look at.
fn audit_event(e: &Value) -> AuditEvent {
    AuditEvent {
        user: e["user"]["username"].as_str().unwrap_or_default().to_string(),
        verb: e["verb"].as_str().unwrap_or_default().to_string(),
        uri: e["requestURI"].as_str().unwrap_or_default().to_string(),
        resource: e["objectRef"]["resource"].as_str().unwrap_or_default().to_string(),
        subresource: e["objectRef"]["subresource"].as_str().unwrap_or_default().to_string(),
        namespace: e["objectRef"]["namespace"].as_str().unwrap_or_default().to_string(),
        name: e["objectRef"]["name"].as_str().unwrap_or_default().to_string(),
        api_group: e["objectRef"]["apiGroup"].as_str().unwrap_or_default().to_string(),
        code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
        decision: e["annotations"]["authorization.k8s.io/decision"].as_str().unwrap_or_default().to_string(),
        received: e["requestReceivedTimestamp"].as_str().and_then(|t| t.parse().ok()),
    }
}

/// One request, as the audit log records it.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// Authenticated user, e.g. `system:serviceaccount:kube-system:gpuscale-a`.
    pub user: String,
    /// Authorization verb (`get`, `list`, `watch`, `create`, `patch`, ...).
    pub verb: String,
    /// Request path and query.
    pub uri: String,
    /// Resource.
    pub resource: String,
    /// Subresource (`eviction`, `status`, ...).
    pub subresource: String,
    /// Namespace.
    pub namespace: String,
    /// Object name.
    pub name: String,
    /// API group (`""` for core).
    pub api_group: String,
    /// HTTP status code (0 for a request never answered).
    pub code: u16,
    /// The authorizer's decision (`allow`, `forbid`).
    pub decision: String,
    /// When the server received the request.
    pub received: Option<k8s_openapi::jiff::Timestamp>,
}

/// The REST path of `obj` (apiVersion, kind, namespace, name) for the built-in kinds tests use.
pub fn object_path(obj: &Value) -> String {
    let api_version = obj["apiVersion"].as_str().expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind");
    let name = obj["metadata"]["name"].as_str().expect("metadata.name");
    let plural = match kind {
        "PodDisruptionBudget" => "poddisruptionbudgets".to_string(),
        "Lease" => "leases".into(),
        "PriorityClass" => "priorityclasses".into(),
        "StorageClass" => "storageclasses".into(),
        "DeviceClass" => "deviceclasses".into(),
        k => {
            let l = k.to_ascii_lowercase();
            if l.ends_with('s') {
                format!("{l}es")
            } else if let Some(stem) = l.strip_suffix('y').filter(|s| !s.ends_with(['a', 'e', 'o', 'u'])) {
                format!("{stem}ies")
            } else {
                format!("{l}s")
            }
        }
    };
    let base = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{base}/namespaces/{ns}/{plural}/{name}"),
        None => format!("{base}/{plural}/{name}"),
    }
}
