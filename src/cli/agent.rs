//! `gpuscale agent`: the node telemetry DaemonSet.

use anyhow::Context;
use clap::Args;
use gpuscale::agent::{self, AgentOptions, InterruptionWatch, NvmlSource, PublishPolicy};
use gpuscale::model::telemetry::parse_duration;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `gpuscale agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Address of the `/metrics` and `/healthz` server.
    #[arg(long, default_value = "0.0.0.0:9400")]
    listen: SocketAddr,
    /// Time between GPU samples (`15s`, `1m`).
    #[arg(long, default_value = "15s", value_parser = parse_secs)]
    interval: u64,
    /// Do not write the node annotation (metrics only).
    #[arg(long)]
    no_annotate: bool,
    /// Node to annotate (the DaemonSet sets it from the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Utilisation in percent below which a GPU counts as idle.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=100))]
    idle_threshold: u8,
    /// Rewrite the annotation at least this often even when nothing changed.
    #[arg(long, default_value = "5m", value_parser = parse_secs)]
    annotate_every: u64,
    /// Never write the annotation more often than this.
    #[arg(long, default_value = "30s", value_parser = parse_secs)]
    annotate_min_gap: u64,
    /// After NVML fails to initialise, try again this often.
    #[arg(long, default_value = "10m", value_parser = parse_secs)]
    nvml_retry: u64,
    /// Path of libnvidia-ml (default: the loader's search for `libnvidia-ml.so`).
    #[arg(long)]
    nvml_library: Option<PathBuf>,
    /// Watch the cloud's instance metadata for interruption notices and taint the node with
    /// `gpuscale.io/interruption` for the controller: `aws` (IMDSv2: spot instance action,
    /// rebalance recommendation, scheduled maintenance), `gcp` (the metadata server's
    /// `instance/preempted` and `instance/maintenance-event`, waited on for changes) or `none`.
    #[arg(long, value_enum, default_value_t = Interruptions::None)]
    interruptions: Interruptions,
    /// The metadata server's address (host:port), EC2's IMDS or GCE's metadata server.
    #[arg(long, alias = "metadata-endpoint", env = "GPUSCALE_IMDS_ENDPOINT", default_value = agent::imds::DEFAULT_ENDPOINT)]
    imds_endpoint: String,
    /// Time between reads of EC2's metadata service (GCE's is waited on; this is the pause after
    /// a failed read there).
    #[arg(long, default_value = "2s", value_parser = parse_secs)]
    interruptions_every: u64,
}

/// Which metadata service to watch for interruption notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Interruptions {
    /// Not watched (read them from the interruption queue, or another handler's taints).
    None,
    /// The EC2 instance metadata service.
    Aws,
    /// The GCE metadata server.
    Gcp,
}

fn parse_secs(text: &str) -> Result<u64, String> {
    parse_duration(text).and_then(|s| if s == 0 { Err("must be more than 0s".into()) } else { Ok(s) })
}

/// Runs the agent until SIGTERM or Ctrl-C.
pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let node_name = if args.no_annotate {
        None
    } else {
        if args.node_name.is_none() {
            tracing::warn!("NODE_NAME is not set and --no-annotate is not given: serving metrics only");
        }
        args.node_name.clone()
    };
    let options = AgentOptions {
        listen: args.listen,
        interval: Duration::from_secs(args.interval),
        node_name,
        idle_threshold_pct: args.idle_threshold,
        publish: PublishPolicy { refresh_secs: args.annotate_every, min_gap_secs: args.annotate_min_gap },
        interruptions: match args.interruptions {
            Interruptions::None => None,
            Interruptions::Aws => Some(agent::MetadataCloud::Aws),
            Interruptions::Gcp => Some(agent::MetadataCloud::Gcp),
        }
        .map(|cloud| InterruptionWatch {
            cloud,
            imds_endpoint: args.imds_endpoint.clone(),
            interval: Duration::from_secs(args.interruptions_every),
        }),
    };
    let source = NvmlSource::new(args.nvml_library.map(PathBuf::into_os_string), args.nvml_retry);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        agent::run(options, Box::new(source), None, shutdown_signal(), None).await.context("gpuscale agent")
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
