//! `gpuscale simulate`: the workload-inflation experiment on a trace.

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use gpuscale::model::Workload;
use gpuscale::scheduler::PolicyKind;
use gpuscale::shown::Shown;
use gpuscale::sim::inflation::{self, CurvePoint, InflationConfig, InflationResult};
use gpuscale::trace::openb;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `gpuscale simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Node list CSV (`sn,cpu_milli,memory_mib,gpu,model`); not used with `--autoscale`.
    #[arg(long, required_unless_present = "autoscale")]
    nodes: Option<PathBuf>,
    /// Replay the trace's arrivals and departures on an autoscaled cluster instead: gpuscale vs a
    /// Cluster-Autoscaler-like baseline vs a static peak-sized cluster vs the cost lower bound.
    #[arg(long)]
    autoscale: bool,
    #[command(flatten)]
    autoscale_args: Box<super::autoscale::AutoscaleArgs>,
    /// Multi-tenant replay instead: a number of tenants to derive from the trace (seeded hash of
    /// pod names; weights 1,2,3,...; nominal GPU quotas summing to the cluster), or a config file
    /// with a `tenancy:` section (pods are spread over its tenants the same way). Replays arrivals
    /// and departures on the fixed `--nodes` with quotas, fair share and preemption, and in plain
    /// FIFO without quotas, and compares them.
    #[arg(long, value_name = "N|CONFIG", conflicts_with = "autoscale")]
    tenants: Option<String>,
    /// With `--tenants`: divide arrival times by this (durations unchanged) to raise contention.
    #[arg(long, default_value_t = 1.0)]
    arrival_speedup: f64,
    /// With `--tenants`: use a seeded subset of the nodes with about this many GPUs.
    #[arg(long, requires = "tenants")]
    cluster_gpus: Option<u64>,
    /// Pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,...]`).
    #[arg(long)]
    pods: PathBuf,
    /// Policies to compare, comma-separated, or `all`: random, dot-product, gpu-packing,
    /// best-fit, fgd, gpuscale (the default policy).
    #[arg(long, default_value = "gpuscale", value_delimiter = ',')]
    policy: Vec<String>,
    /// Stop arrivals when their GPU demand reaches this multiple of the cluster's GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    inflate: f64,
    /// Seed of one run.
    #[arg(long, default_value_t = 42, conflicts_with = "seeds")]
    seed: u64,
    /// Several seeds, as a range `42-51` or a list `1,5,9`; results are averaged.
    #[arg(long)]
    seeds: Option<String>,
    /// Share of tasks the expected-workload shapes cover (fragmentation-aware policies).
    #[arg(long, default_value_t = 0.95)]
    coverage: f64,
    /// Folder for `curve.csv`, `summary.json` and the plot `allocation.svg`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Summary format on stdout.
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Worker threads for parallel seeds (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

/// Mean results of one policy over the seeds.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PolicySummary {
    policy: String,
    seeds: Vec<u64>,
    allocated_pct_at_100: f64,
    allocated_pct_at_end: f64,
    failed_pods: f64,
    fragmentation_pct_at_end: f64,
    curve: Vec<CurvePoint>,
    runs: Vec<InflationResult>,
}

fn parse_seeds(spec: &str) -> anyhow::Result<Vec<u64>> {
    let mut seeds = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u64, u64) = (
                a.trim().parse().with_context(|| format!("--seeds: {a:?} is not a number"))?,
                b.trim().parse().with_context(|| format!("--seeds: {b:?} is not a number"))?,
            );
            if b < a {
                bail!("--seeds: range {part:?} is empty");
            }
            seeds.extend(a..=b);
        } else {
            seeds.push(part.parse().with_context(|| format!("--seeds: {part:?} is not a number"))?);
        }
    }
    if seeds.is_empty() {
        bail!("--seeds: no seed given");
    }
    Ok(seeds)
}

fn parse_policies(names: &[String]) -> anyhow::Result<Vec<PolicyKind>> {
    if names.iter().any(|n| n == "all") {
        return Ok(PolicyKind::ALL.to_vec());
    }
    names.iter().map(|n| n.parse::<PolicyKind>().map_err(|e| anyhow::anyhow!("--policy: {e}"))).collect()
}

/// Runs the command.
pub fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    if args.autoscale {
        let json = matches!(args.output, Format::Json);
        return super::autoscale::run(&args.pods, args.seed, args.out.as_deref(), json, &args.autoscale_args);
    }
    let nodes_path = args.nodes.clone().context("--nodes is required without --autoscale")?;
    if let Some(spec) = &args.tenants {
        return run_tenants(&args, spec, &nodes_path);
    }
    if !(args.inflate > 0.0 && args.inflate <= 10.0) {
        bail!("--inflate: {} is out of range (0, 10]", args.inflate);
    }
    if !(args.coverage > 0.0 && args.coverage <= 1.0) {
        bail!("--coverage: {} is out of range (0, 1]", args.coverage);
    }
    let seeds = match &args.seeds {
        Some(spec) => parse_seeds(spec)?,
        None => vec![args.seed],
    };
    let policies = parse_policies(&args.policy)?;
    let nodes = openb::read_nodes(&nodes_path)?;
    let trace: Vec<Workload> = openb::read_pods(&args.pods)?.into_iter().map(|p| p.workload).collect();
    let gpus: usize = nodes.iter().map(|n| n.gpus.len()).sum();
    if gpus == 0 {
        bail!("{}: the node list has no GPUs", nodes_path.display());
    }
    tracing::info!(
        nodes = nodes.len(),
        gpus,
        tasks = trace.len(),
        runs = seeds.len() * policies.len(),
        "simulating"
    );

    let jobs: Vec<(PolicyKind, u64)> =
        policies.iter().flat_map(|&p| seeds.iter().map(move |&s| (p, s))).collect();
    let bar = ProgressBar::new((jobs.len() * 1000) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {percent}% ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let results: Vec<InflationResult> = pool.install(|| {
        jobs.par_iter()
            .map(|&(policy, seed)| {
                let config = InflationConfig { policy, inflate: args.inflate, seed, coverage: args.coverage };
                let mut reported = 0u64;
                inflation::run(&nodes, &trace, &config, &mut |done, total| {
                    let permille = (done as u64 * 1000) / total.max(1) as u64;
                    bar.inc(permille - reported);
                    reported = permille;
                })
            })
            .collect()
    });
    bar.finish_and_clear();

    let summaries: Vec<PolicySummary> = policies.iter().map(|p| summarize(*p, &seeds, &results)).collect();
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&summaries)?),
        Format::Table => print_table(&args, &seeds, &summaries, gpus, trace.len(), nodes.len()),
    }
    if let Some(out) = &args.out {
        write_outputs(out, &summaries, args.inflate)?;
        eprintln!(
            "wrote {}, {} and {}",
            Shown(out.join("curve.csv").display()),
            Shown(out.join("summary.json").display()),
            Shown(out.join("allocation.svg").display())
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn summarize(policy: PolicyKind, seeds: &[u64], results: &[InflationResult]) -> PolicySummary {
    let runs: Vec<InflationResult> =
        results.iter().filter(|r| r.policy == policy.as_str()).cloned().collect();
    let n = runs.len().max(1) as f64;
    let mean = |f: &dyn Fn(&InflationResult) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let mut by_pct: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    for r in &runs {
        for p in &r.curve {
            let e = by_pct.entry(p.arrived_pct).or_default();
            e.0 += p.allocated_pct;
            e.1 += 1;
        }
    }
    PolicySummary {
        policy: policy.as_str().to_string(),
        seeds: seeds.to_vec(),
        allocated_pct_at_100: mean(&|r| r.allocated_pct_at_100),
        allocated_pct_at_end: mean(&|r| r.allocated_pct_at_end),
        failed_pods: mean(&|r| r.failed as f64),
        fragmentation_pct_at_end: mean(&|r| r.fragmentation_pct_at_end),
        curve: by_pct
            .into_iter()
            .map(|(pct, (sum, k))| CurvePoint { arrived_pct: pct, allocated_pct: sum / f64::from(k) })
            .collect(),
        runs,
    }
}

fn print_table(
    args: &SimulateArgs,
    seeds: &[u64],
    summaries: &[PolicySummary],
    gpus: usize,
    tasks: usize,
    nodes: usize,
) {
    let end = (args.inflate * 100.0).round();
    println!(
        "trace {} ({tasks} tasks) on {} ({nodes} nodes, {gpus} GPUs); arrivals to {end}% of GPU capacity; {} seed(s) {}",
        args.pods.display(),
        args.nodes.as_deref().unwrap_or(std::path::Path::new("?")).display(),
        seeds.len(),
        seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    );
    let fgd = summaries.iter().find(|s| s.policy == "fgd").map(|s| 100.0 - s.allocated_pct_at_end);
    println!(
        "{:<12} {:>10} {:>10} {:>12} {:>10} {:>16}",
        "POLICY",
        "ALLOC@100%",
        format!("ALLOC@{end}%"),
        "FAILED PODS",
        "FRAG@END",
        "UNALLOC VS FGD"
    );
    for s in summaries {
        let vs_fgd = match fgd {
            Some(f) if f > 0.0 => format!("{:+.1}%", ((100.0 - s.allocated_pct_at_end) / f - 1.0) * 100.0),
            _ => "-".into(),
        };
        println!(
            "{:<12} {:>9.2}% {:>9.2}% {:>12.1} {:>9.2}% {:>16}",
            s.policy,
            s.allocated_pct_at_100,
            s.allocated_pct_at_end,
            s.failed_pods,
            s.fragmentation_pct_at_end,
            vs_fgd
        );
    }
}

fn write_outputs(out: &PathBuf, summaries: &[PolicySummary], inflate: f64) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let csv_path = out.join("curve.csv");
    let mut csv = std::io::BufWriter::new(
        std::fs::File::create(&csv_path).with_context(|| format!("creating {}", csv_path.display()))?,
    );
    write!(csv, "arrived_pct")?;
    for s in summaries {
        write!(csv, ",{}", s.policy)?;
    }
    writeln!(csv)?;
    let max_pct = summaries.iter().flat_map(|s| s.curve.last()).map(|p| p.arrived_pct).max().unwrap_or(0);
    for pct in 0..=max_pct {
        write!(csv, "{pct}")?;
        for s in summaries {
            match s.curve.iter().find(|p| p.arrived_pct == pct) {
                Some(p) => write!(csv, ",{:.4}", p.allocated_pct)?,
                None => write!(csv, ",")?,
            }
        }
        writeln!(csv)?;
    }
    csv.flush()?;
    let json_path = out.join("summary.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(summaries)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let series: Vec<(String, Vec<(f64, f64)>)> = summaries
        .iter()
        .map(|s| {
            (s.policy.clone(), s.curve.iter().map(|p| (f64::from(p.arrived_pct), p.allocated_pct)).collect())
        })
        .collect();
    super::plot::line_chart(
        &out.join("allocation.svg"),
        "GPU allocation as demand arrives",
        "arrived GPU demand (% of capacity)",
        "allocated GPUs (% of capacity)",
        (0.0, inflate * 100.0),
        &series,
    )
}

/// `--tenants`: the multi-tenant replay, tenancy vs FIFO.
fn run_tenants(args: &SimulateArgs, spec: &str, nodes_path: &std::path::Path) -> anyhow::Result<ExitCode> {
    use gpuscale::sim::tenants::{self, TenantSimConfig};
    if !(args.arrival_speedup > 0.0 && args.arrival_speedup.is_finite()) {
        bail!("--arrival-speedup: {} must be a positive number", args.arrival_speedup);
    }
    let policy = match parse_policies(&args.policy)?.as_slice() {
        [one] => *one,
        _ => bail!("--tenants replays one placement policy; give one --policy"),
    };
    let all_nodes = openb::read_nodes(nodes_path)?;
    let nodes = tenants::subset(&all_nodes, args.cluster_gpus, args.seed);
    let gpus: u64 = nodes.iter().map(|n| n.gpus.len() as u64).sum();
    if gpus == 0 {
        bail!("{}: the node list has no GPUs", nodes_path.display());
    }
    let trace = openb::read_pods(&args.pods)?;
    let config = match spec.parse::<usize>() {
        Ok(0) => bail!("--tenants: need at least one tenant"),
        Ok(n) => tenants::derive_tenants(n, gpus),
        Err(_) => {
            let path = PathBuf::from(spec);
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("--tenants: reading {spec}"))?;
            let c = gpuscale::tenancy::TenancyConfig::parse(&path, &text)?;
            if c.tenants.is_empty() {
                bail!("{spec}: tenancy.tenants is empty");
            }
            c
        }
    };
    let assignment = tenants::assign(&trace, config.tenants.len(), args.seed);
    let cfg = TenantSimConfig {
        seed: args.seed,
        arrival_speedup: args.arrival_speedup,
        cluster_gpus: args.cluster_gpus,
        policy,
    };
    let result = tenants::run(&nodes, &trace, &config, &assignment, &cfg);
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&result)?),
        Format::Table => print_tenants(&result),
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let csv_path = out.join("tenants.csv");
        let mut csv = std::io::BufWriter::new(
            std::fs::File::create(&csv_path).with_context(|| format!("creating {}", csv_path.display()))?,
        );
        writeln!(
            csv,
            "mode,tenant,weight,entitlement,gpu_share,contended_share,fair_share,gpu_hours,pods,never_started,p50_wait_s,p95_wait_s,preempted"
        )?;
        for m in [&result.tenancy, &result.fifo] {
            for t in &m.tenants {
                writeln!(
                    csv,
                    "{},{},{},{:.4},{:.4},{:.4},{:.4},{:.2},{},{},{},{},{}",
                    m.mode,
                    t.tenant,
                    t.weight,
                    t.entitlement,
                    t.gpu_share,
                    t.contended_share,
                    t.fair_share,
                    t.gpu_hours,
                    t.pods,
                    t.never_started,
                    t.p50_wait_s,
                    t.p95_wait_s,
                    t.preempted
                )?;
            }
        }
        csv.flush()?;
        let json_path = out.join("summary.json");
        std::fs::write(&json_path, serde_json::to_vec_pretty(&result)?)
            .with_context(|| format!("writing {}", json_path.display()))?;
        eprintln!("wrote {} and {}", Shown(out.join("tenants.csv").display()), Shown(json_path.display()));
    }
    Ok(ExitCode::SUCCESS)
}

fn print_tenants(r: &gpuscale::sim::tenants::TenantSimResult) {
    println!(
        "{} pods on {} nodes ({} GPUs), {} s replayed, seed {}",
        r.pods, r.nodes, r.gpus, r.horizon_s, r.seed
    );
    println!(
        "{:<8} {:>7} {:>9} {:>10} {:>10} {:>11} {:>13} {:>9}",
        "MODE", "JAIN", "JAIN(ENT)", "P50 WAIT", "P95 WAIT", "PREEMPTIONS", "NEVER STARTED", "GPU UTIL"
    );
    for m in [&r.tenancy, &r.fifo] {
        println!(
            "{:<8} {:>7.3} {:>9.3} {:>9.0}s {:>9.0}s {:>11} {:>13} {:>8.1}%",
            m.mode,
            m.jain_index,
            m.jain_vs_entitlement,
            m.p50_wait_s,
            m.p95_wait_s,
            m.preemptions,
            m.never_started,
            m.gpu_utilization_pct
        );
    }
    println!(
        "\n{:<8} {:<12} {:>6} {:>11} {:>15} {:>11} {:>10} {:>10} {:>10}",
        "MODE",
        "TENANT",
        "WEIGHT",
        "ENTITLED",
        "SHARE(CONTEND)",
        "FAIR SHARE",
        "P50 WAIT",
        "P95 WAIT",
        "PREEMPTED"
    );
    for m in [&r.tenancy, &r.fifo] {
        for t in &m.tenants {
            println!(
                "{:<8} {:<12} {:>6} {:>10.1}% {:>14.1}% {:>10.1}% {:>9.0}s {:>9.0}s {:>10}",
                m.mode,
                t.tenant,
                t.weight,
                t.entitlement * 100.0,
                t.contended_share * 100.0,
                t.fair_share * 100.0,
                t.p50_wait_s,
                t.p95_wait_s,
                t.preempted
            );
        }
    }
}
