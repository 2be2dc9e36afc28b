//! `gpuscale plan`: the dry-run scaling plan for a cluster snapshot.

use anyhow::Context;
use clap::{Args, ValueEnum};
use gpuscale::config::GpuscaleConfig;
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use gpuscale::providers::config::{self, ProviderConfig};
use gpuscale::scheduler::PolicyKind;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The example cluster `plan` shows when given no snapshot.
const EMBEDDED_SNAPSHOT: &str = include_str!("../../examples/snapshots/mixed-gpu-cluster.json");
const EMBEDDED_SNAPSHOT_NAME: &str = "<embedded>/examples/snapshots/mixed-gpu-cluster.json";

/// Arguments of `gpuscale plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Cluster snapshot: `kubectl get nodes,pods,poddisruptionbudgets -A -o json` output, a
    /// YAML/JSON manifest, a folder of them, or `-` for standard input. Needs `--providers`.
    #[arg(long, requires = "providers")]
    snapshot: Option<PathBuf>,
    /// Provider config file(s) or folders of them with the node groups (repeatable). Offline, a
    /// cloud group's current size is the number of its nodes in the cluster.
    #[arg(long)]
    providers: Vec<PathBuf>,
    /// Plan the live cluster of this kubeconfig file (default without `--snapshot`: `KUBECONFIG`,
    /// else `~/.kube/config`, else the in-cluster ServiceAccount).
    #[arg(long, conflicts_with = "snapshot")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context of the live cluster to plan (default: its current context).
    #[arg(long, conflicts_with = "snapshot")]
    context: Option<String>,
    /// Largest snapshot input in MiB (a 5,000-node cluster's `kubectl get -o json` is about
    /// 170 MiB).
    #[arg(long, default_value_t = gpuscale::textfile::DEFAULT_MAX_INPUT_BYTES >> 20, value_name = "MIB")]
    max_input_mib: u64,
    /// Deepest nesting of lists and maps accepted in the snapshot.
    #[arg(long, default_value_t = gpuscale::textfile::DEFAULT_MAX_DEPTH, value_name = "LEVELS")]
    max_nesting: usize,
    /// Read the node groups' real sizes and instances from the cloud (the provider config's
    /// credentials), as `gpuscale run` does, instead of counting the snapshot's nodes.
    #[arg(long, requires = "providers")]
    live_groups: bool,
    /// Plan the embedded example cluster and its simulated account (what `plan` does with no
    /// `--snapshot` where no kubeconfig is found).
    #[arg(long, conflicts_with_all = ["snapshot", "providers", "kubeconfig", "context"])]
    example: bool,
    /// gpuscale config file (`planner:` section and the others); the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Placement policy for pending pods (default: the config's, else `gpuscale`).
    #[arg(long)]
    policy: Option<PolicyKind>,
    /// Do not plan scale-down or consolidation.
    #[arg(long)]
    no_scale_down: bool,
    /// Scale-down utilisation threshold (0..1; default: the config's, else 1.0: every node whose
    /// pods fit elsewhere; 0.5 is Cluster Autoscaler's).
    #[arg(long)]
    scale_down_utilization: Option<f64>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

/// Where the cluster to plan comes from.
enum Source {
    Example,
    Snapshot(PathBuf),
    Live,
}

impl Source {
    /// `--snapshot`, `--example`, an explicit kubeconfig or context, else the live cluster when a
    /// kubeconfig or in-cluster ServiceAccount is found (as kubectl finds them), else the example.
    fn of(args: &PlanArgs) -> Self {
        match (&args.snapshot, args.example) {
            (Some(path), _) => Source::Snapshot(path.clone()),
            (None, true) => Source::Example,
            (None, false) if args.kubeconfig.is_some() || args.context.is_some() || cluster_configured() => {
                Source::Live
            }
            (None, false) => Source::Example,
        }
    }
}

/// Whether kubectl would find a cluster here: `KUBECONFIG` naming a file that exists (when it is
/// set, `~/.kube/config` is not read), else `~/.kube/config`, else a pod's ServiceAccount.
fn cluster_configured() -> bool {
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(list) => std::env::split_paths(&list).any(|p| p.is_file()),
        None => {
            std::env::var_os("HOME").is_some_and(|h| Path::new(&h).join(".kube/config").is_file())
                || (std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
                    && Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").is_file())
        }
    }
}

/// The live cluster's objects, read as `gpuscale run` reads them, and a line saying which
/// cluster it was.
#[cfg(feature = "controller")]
fn read_live(
    args: &PlanArgs,
    config: &GpuscaleConfig,
    now: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<(gpuscale::k8s::LoadedSnapshot, String)> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let options = KubeConfigOptions { context: args.context.clone(), ..Default::default() };
        // kube's messages already hold their causes, which `source()` would repeat.
        let kube_config = match (&args.kubeconfig, &args.context) {
            (Some(path), _) => {
                let read = |e: &(dyn std::error::Error + 'static)| {
                    // The path once: kube's message names it again.
                    let message = super::kube_config_message(e);
                    let shown = path.display().to_string();
                    if message.contains(&shown) {
                        anyhow::anyhow!("--kubeconfig: {message}")
                    } else {
                        anyhow::anyhow!("--kubeconfig {shown}: {message}")
                    }
                };
                let file = Kubeconfig::read_from(path).map_err(|e| read(&e))?;
                kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|e| read(&e))?
            }
            (None, Some(context)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| anyhow::anyhow!("--context {context}: {}", super::kube_config_message(&e)))?,
            (None, None) => kube::Config::infer().await.map_err(|e| {
                anyhow::anyhow!(
                    "finding the Kubernetes API server (kubeconfig or in-cluster): {}",
                    super::kube_config_message(&e)
                )
            })?,
        };
        let server = kube_config.cluster_url.to_string();
        let client = gpuscale::controller::client(kube_config).context("building the Kubernetes client")?;
        let view = gpuscale::controller::live::read(&client, &config.controller, now)
            .await
            .with_context(|| format!("reading the cluster at {server}"))?;
        let what = match &args.context {
            Some(context) => format!("the live cluster of context {context} ({server})"),
            None => format!("the live cluster at {server}"),
        };
        Ok((gpuscale::k8s::LoadedSnapshot { snapshot: view.snapshot, warnings: view.warnings }, what))
    })
}

#[cfg(not(feature = "controller"))]
fn read_live(
    _: &PlanArgs,
    _: &GpuscaleConfig,
    _: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<(gpuscale::k8s::LoadedSnapshot, String)> {
    anyhow::bail!(
        "planning a live cluster needs the Kubernetes client, which this build leaves out (cargo feature controller); pass --snapshot or --example"
    )
}

/// The node groups with their sizes as `plan` knows them offline: a cloud account's groups hold
/// the nodes the snapshot shows of them (a config `targetSize` that disagrees is a warning); a
/// simulated account's sizes are its config's, the state of its simulated cloud.
fn offline_sizes(
    providers: &ProviderConfig,
    snapshot: &gpuscale::model::ClusterSnapshot,
    warnings: &mut Vec<String>,
) -> Vec<gpuscale::model::NodeGroup> {
    let simulated = |g: &gpuscale::model::NodeGroup| {
        providers.account(&g.account).is_some_and(|a| a.provider == config::ProviderKind::Simulated)
    };
    let mut cloud: Vec<_> = providers.node_groups().into_iter().filter(|g| !simulated(g)).collect();
    let stated: Vec<Option<u32>> = cloud
        .iter()
        .map(|g| {
            let account = providers.account(&g.account)?;
            account.node_groups.iter().find(|c| c.name == g.name()).and_then(|c| c.target_size)
        })
        .collect();
    gpuscale::planner::cluster::sizes_from_snapshot(&mut cloud, snapshot, &stated, warnings);
    let mut groups = providers.node_groups();
    for g in groups.iter_mut() {
        if let Some(c) = cloud.iter().find(|c| c.id == g.id) {
            g.target_size = c.target_size;
        }
    }
    groups
}

/// The groups of every account with the sizes and instances the cloud reports now. An account
/// that cannot be read is an error: a plan from guessed sizes is what this flag avoids.
#[cfg(feature = "controller")]
fn live_groups(providers: &ProviderConfig) -> anyhow::Result<Vec<gpuscale::model::NodeGroup>> {
    use gpuscale::controller::providers::ProviderSet;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let set = ProviderSet::connect(providers).await?;
        let refreshed = set.refresh().await;
        if let Some((account, error)) = refreshed.failures.first() {
            anyhow::bail!("--live-groups: account {account}: {error}");
        }
        Ok(refreshed.groups)
    })
}

#[cfg(not(feature = "controller"))]
fn live_groups(_: &ProviderConfig) -> anyhow::Result<Vec<gpuscale::model::NodeGroup>> {
    anyhow::bail!(
        "--live-groups needs the cloud providers, which this build leaves out (cargo feature controller)"
    )
}

/// Runs the command.
pub fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    if let Some(u) = args.scale_down_utilization.filter(|u| !(0.0..=1.0).contains(u)) {
        anyhow::bail!("--scale-down-utilization: {u} is outside 0..1");
    }
    let settings_file = match &args.config {
        Some(path) => GpuscaleConfig::load(path)?,
        None => GpuscaleConfig::default(),
    };
    let limits = gpuscale::textfile::InputLimits {
        max_bytes: args.max_input_mib.saturating_mul(1 << 20),
        max_depth: args.max_nesting,
    };
    let seconds =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let now = k8s_openapi::jiff::Timestamp::from_second(seconds as i64)
        .map_err(|e| anyhow::anyhow!("the system clock: {e}"))?;
    let source = Source::of(&args);
    let (mut loaded, what) = match &source {
        Source::Snapshot(path) => (gpuscale::k8s::load_snapshot_with(path, limits)?, None),
        Source::Live => {
            let (loaded, what) = read_live(&args, &settings_file, now)?;
            (loaded, Some(what))
        }
        Source::Example => {
            if !args.providers.is_empty() {
                anyhow::bail!(
                    "--providers: no cluster to plan; pass --snapshot, or --kubeconfig/--context (no KUBECONFIG, ~/.kube/config or in-cluster ServiceAccount was found)"
                );
            }
            let objects = gpuscale::k8s::parse_text(Path::new(EMBEDDED_SNAPSHOT_NAME), EMBEDDED_SNAPSHOT)?;
            eprintln!("gpuscale plan: the embedded example cluster and its simulated account (no kubeconfig found; pass --kubeconfig/--context, or --snapshot and --providers, for yours)");
            (gpuscale::k8s::convert(&objects)?, None)
        }
    };
    let providers: ProviderConfig = match &source {
        Source::Example => ProviderConfig::embedded_default()?,
        _ if args.providers.is_empty() => {
            loaded.warnings.push(
                "no --providers: the plan knows no node groups, so it places pending pods on existing nodes and plans no scale-up or scale-down of groups"
                    .into(),
            );
            ProviderConfig::default()
        }
        _ => config::load_files(&args.providers)?,
    };
    if let Some(what) = &what {
        eprintln!("gpuscale plan: {}", gpuscale::shown::Shown(what));
    }
    let groups = if args.live_groups {
        live_groups(&providers)?
    } else {
        offline_sizes(&providers, &loaded.snapshot, &mut loaded.warnings)
    };
    // Which nodes are capacity, as `gpuscale run` judges them: starting, Ready, unready.
    let lifecycle = settings_file.controller.lifecycle_settings(now.as_second(), &settings_file.telemetry);
    for verdict in planner::readiness::judge_nodes(&mut loaded.snapshot, &groups, &lifecycle) {
        loaded.warnings.push(verdict.describe());
    }
    let input = PlanInput { snapshot: loaded.snapshot, groups, ..Default::default() };
    let mut settings: PlannerSettings = settings_file.planner;
    settings.unready_seconds = settings_file.controller.scale_down_unready_seconds;
    settings.telemetry = settings_file.telemetry;
    settings.tenancy = settings_file.tenancy;
    settings.now = Some(now.as_second());
    settings.saved_snapshot = !matches!(source, Source::Live);
    if let Some(policy) = args.policy {
        settings.policy = policy;
    }
    if let Some(u) = args.scale_down_utilization {
        settings.scale_down_utilization = u;
    }
    settings.scale_down &= !args.no_scale_down;
    let start = std::time::Instant::now();
    let mut plan = planner::plan(&input, &settings);
    tracing::info!(seconds = start.elapsed().as_secs_f32(), "planned");
    // The process ends after printing: freeing a 60,000-pod cluster object by object would only
    // delay the exit (a tenth of a second at 5,000 nodes).
    std::mem::forget(input);
    let mut warnings = loaded.warnings;
    warnings.append(&mut plan.warnings);
    plan.warnings = warnings;
    let text = match args.output {
        Output::Table => plan.to_table(),
        Output::Json => serde_json::to_string_pretty(&plan).context("encoding the plan")? + "\n",
        Output::Yaml => serde_yaml::to_string(&plan).context("encoding the plan")?,
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
