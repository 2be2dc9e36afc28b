//! `gpuscale generate`: a real-shaped cluster snapshot of any size, with its provider config, to
//! try `plan` at the scale of a production cluster.

use anyhow::Context;
use clap::Args;
use gpuscale::sim::kubectl_list::{self, ListShape};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Running and pending pods per node when `--running` and `--pending` are not given: a cluster of
/// any `--nodes` has the shape of the default one (5,000 nodes, 50,000 running, 10,000 pending).
const RUNNING_PER_NODE: usize = 10;
const PENDING_PER_NODE: usize = 2;

/// Arguments of `gpuscale generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// GPU nodes (H100, A100, A100 in MIG, time-sliced L4 and A10G pools).
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Running pods, spread over the nodes (default: 10 per node).
    #[arg(long)]
    running: Option<usize>,
    /// Pending pods (default: 2 per node).
    #[arg(long)]
    pending: Option<usize>,
    /// Random seed (the same arguments give the same files).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Include `metadata.managedFields`, as the API server's lists have them (kubectl hides them).
    #[arg(long)]
    managed_fields: bool,
    /// Folder to write `cluster.json` (the `kubectl get nodes,pods -A -o json` List) and
    /// `providers.yaml` (the node groups) into; created if missing.
    #[arg(long, short = 'o')]
    out: PathBuf,
}

/// Writes the snapshot and the provider config, and says how to plan them.
pub fn run(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let shape = ListShape {
        nodes: args.nodes,
        running: args.running.unwrap_or(args.nodes.saturating_mul(RUNNING_PER_NODE)),
        pending: args.pending.unwrap_or(args.nodes.saturating_mul(PENDING_PER_NODE)),
        seed: args.seed,
        managed_fields: args.managed_fields,
    };
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let snapshot = args.out.join("cluster.json");
    let providers = args.out.join("providers.yaml");
    let file =
        std::fs::File::create(&snapshot).with_context(|| format!("creating {}", snapshot.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let (cluster, groups) = kubectl_list::cluster(&shape);
    kubectl_list::write_list(&shape, &cluster, &mut out)
        .and_then(|()| out.flush())
        .with_context(|| format!("writing {}", snapshot.display()))?;
    std::fs::write(&providers, kubectl_list::provider_config(&groups))
        .with_context(|| format!("writing {}", providers.display()))?;
    let bytes = std::fs::metadata(&snapshot).map(|m| m.len()).unwrap_or(0);
    let running = cluster.workloads.iter().filter(|w| w.node_name.is_some()).count();
    println!(
        "wrote {} ({} nodes, {running} running and {} pending pods, {:.0} MiB) and {}\nplan it with: gpuscale plan --snapshot {} --providers {}",
        snapshot.display(),
        cluster.nodes.len(),
        cluster.workloads.len() - running,
        bytes as f64 / f64::from(1 << 20),
        providers.display(),
        snapshot.display(),
        providers.display()
    );
    Ok(ExitCode::SUCCESS)
}
