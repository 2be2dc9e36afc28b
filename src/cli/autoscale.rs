//! `gpuscale simulate --autoscale`: the autoscaling replay's files in, report out.

use anyhow::{bail, Context};
use clap::Args;
use gpuscale::planner::decide::DecideSettings;
use gpuscale::providers::config::{self, ProviderKind};
use gpuscale::providers::simulated::SimulationSettings;
use gpuscale::sim::autoscale::{self, AutoscaleConfig, Comparison};
use gpuscale::trace::openb;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Options of the autoscaling replay (with `--autoscale`).
#[derive(Debug, Args)]
pub struct AutoscaleArgs {
    /// Replay window length in hours.
    #[arg(long, default_value_t = 24.0)]
    window_hours: f64,
    /// Window start, hours from the trace start (default: the whole hour starting the window with
    /// the most GPU demand, in GPU-seconds). Pods running
    /// at the start join at once.
    #[arg(long)]
    window_start_hours: Option<f64>,
    /// Provider config whose simulated accounts' node groups are scaled (default: embedded groups
    /// shaped like the openb nodes).
    #[arg(long)]
    providers: Option<PathBuf>,
    /// Autoscaler loop period in seconds of virtual time.
    #[arg(long, default_value_t = 10)]
    interval_seconds: u64,
    /// Minutes a node must stay removable before it is removed, empty or not (both autoscalers;
    /// default: the controller's `scaleDownUnneededSeconds`).
    #[arg(long)]
    unneeded_minutes: Option<f64>,
    /// gpuscale's scale-down threshold: GPU nodes allocated below this share are removal
    /// candidates when their pods fit elsewhere; 1.0 (the default): every node is (Karpenter's
    /// rule), 0.5: Cluster Autoscaler's.
    #[arg(long, default_value_t = 1.0)]
    scale_down_utilization: f64,
    /// Turn off gpuscale's consolidation (replacing nodes by cheaper ones).
    #[arg(long)]
    no_consolidation: bool,
    /// Instance boot time in seconds (default: the provider config's simulation settings).
    #[arg(long)]
    boot_seconds: Option<u64>,
    /// Probability that a launch fails out-of-capacity (default: the provider config's).
    #[arg(long)]
    capacity_error_rate: Option<f64>,
    /// The replay with spot capacity: every group gets a spot twin, spot instances are
    /// interrupted (a notice, then the reclaim) and spot launches fail for capacity at their own
    /// rate; gpuscale (reading notices) and the CA-like baseline (which sees none) run with spot
    /// allowed and on-demand only (docs/spot.md).
    #[arg(long)]
    interruptions: bool,
    /// With `--interruptions`: interruptions per running spot instance per hour.
    #[arg(long, default_value_t = 0.1)]
    spot_interruptions_per_hour: f64,
    /// With `--interruptions`: seconds from the notice to the reclaim (AWS 120, GCP 30).
    #[arg(long, default_value_t = 120)]
    notice_seconds: u64,
    /// With `--interruptions`: a spot twin's price as a share of its group's on-demand price.
    #[arg(long, default_value_t = 0.35)]
    spot_price_factor: f64,
    /// With `--interruptions`: probability that a spot launch fails for capacity.
    #[arg(long, default_value_t = 0.1)]
    spot_capacity_error_rate: f64,
}

/// Runs the replay and writes the report.
pub fn run(
    pods: &Path,
    seed: u64,
    out: Option<&Path>,
    json: bool,
    args: &AutoscaleArgs,
) -> anyhow::Result<ExitCode> {
    if args.window_hours.is_nan() || args.window_hours <= 0.0 {
        bail!("--window-hours: {} must be positive", args.window_hours);
    }
    if args.interval_seconds == 0 {
        bail!("--interval-seconds: must be at least 1");
    }
    let (groups, mut cloud) = match &args.providers {
        Some(path) => {
            let cfg = config::load_files(&[path])?;
            let account = cfg
                .accounts
                .iter()
                .find(|a| a.provider == ProviderKind::Simulated)
                .with_context(|| format!("{}: no account with provider: simulated", path.display()))?;
            let settings = account.simulation.as_ref().map(SimulationSettings::from).unwrap_or_default();
            (cfg.node_groups_of(&account.name), settings)
        }
        None => autoscale::openb_groups()?,
    };
    if let Some(b) = args.boot_seconds {
        cloud.boot = Duration::from_secs(b);
    }
    if let Some(r) = args.capacity_error_rate {
        if !(0.0..=1.0).contains(&r) {
            bail!("--capacity-error-rate: {r} is out of range [0, 1]");
        }
        cloud.capacity_error_rate = r;
    }
    let trace = openb::read_pods(pods)?;
    let start = Some(match args.window_start_hours {
        Some(h) => (h * 3600.0).round().max(0.0) as u64,
        None => autoscale::busiest_window_start(&trace, args.window_hours),
    });
    let jobs = autoscale::jobs_from_openb(&trace, start, args.window_hours);
    tracing::info!(
        pods = jobs.jobs.len(),
        skipped_without_times = jobs.skipped_without_times,
        window_start_s = jobs.start,
        window_s = jobs.length,
        groups = groups.len(),
        "autoscaling replay"
    );
    let defaults = DecideSettings::default();
    let cfg = AutoscaleConfig {
        interval: args.interval_seconds,
        decide: DecideSettings {
            unneeded_seconds: args.unneeded_minutes.map_or(defaults.unneeded_seconds, |m| m * 60.0),
            ..defaults
        },
        seed,
        scale_down_utilization: args.scale_down_utilization,
        consolidation: !args.no_consolidation,
        cloud,
        ..Default::default()
    };
    if args.interruptions {
        return run_spot(pods, &jobs, &groups, cfg, json, args);
    }
    let cmp = autoscale::compare(&jobs, &groups, &cfg);
    if json {
        let summary = serde_json::json!({
            "pods": jobs.jobs.len(),
            "skippedWithoutTimes": jobs.skipped_without_times,
            "windowStartSeconds": jobs.start,
            "windowSeconds": jobs.length,
            "lowerBound": cmp.lower_bound,
            "policies": cmp.runs.iter().map(|r| serde_json::json!({
                "policy": r.policy.name(),
                "cost": r.cost,
                "gpuHours": r.gpu_hours,
                "costOverLowerBound": r.cost / cmp.lower_bound.cost,
                "meanAllocation": r.mean_allocation,
                "pendingP50": r.pending_p50,
                "pendingP95": r.pending_p95,
                "pendingP99": r.pending_p99,
                "scaleActions": r.scale_actions,
                "disrupted": r.disrupted,
                "ran": r.ran,
                "neverRan": r.never_ran,
                "launchFailures": r.launch_failures,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(pods, &jobs, &cmp);
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_csv(&dir.join("autoscale.csv"), &cmp)?;
        write_svg(&dir.join("autoscale.svg"), &cmp, jobs.length)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The replay with interruptions and capacity errors (`--interruptions`).
fn run_spot(
    pods: &Path,
    jobs: &autoscale::Jobs,
    groups: &[gpuscale::model::NodeGroup],
    mut cfg: AutoscaleConfig,
    json: bool,
    args: &AutoscaleArgs,
) -> anyhow::Result<ExitCode> {
    for (flag, v, max) in [
        ("--spot-interruptions-per-hour", args.spot_interruptions_per_hour, f64::INFINITY),
        ("--spot-price-factor", args.spot_price_factor, 1.0),
        ("--spot-capacity-error-rate", args.spot_capacity_error_rate, 1.0),
    ] {
        if !(v.is_finite() || max.is_infinite()) || !(0.0..=max).contains(&v) {
            bail!("{flag}: {v} is out of range [0, {max}]");
        }
    }
    cfg.cloud.spot_interruptions_per_hour = args.spot_interruptions_per_hour;
    cfg.cloud.interruption_notice = Duration::from_secs(args.notice_seconds);
    cfg.cloud.spot_capacity_error_rate = Some(args.spot_capacity_error_rate);
    let cmp = autoscale::compare_spot(jobs, groups, args.spot_price_factor, &cfg);
    if json {
        println!("{}", serde_json::to_string_pretty(&spot_summary(jobs, &cmp))?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "trace {}: {} pods in a {:.1} h window from t={} s; spot: {:.2} interruptions/instance-h, {} s notice, {:.0}% of on-demand price, {:.0}% spot / {:.0}% on-demand launch failures",
        pods.display(),
        jobs.jobs.len(),
        jobs.length as f64 / 3600.0,
        jobs.start,
        args.spot_interruptions_per_hour,
        args.notice_seconds,
        args.spot_price_factor * 100.0,
        args.spot_capacity_error_rate * 100.0,
        cfg.cloud.capacity_error_rate * 100.0,
    );
    println!(
        "{:<26} {:>9} {:>8} {:>7} {:>7} {:>9} {:>8} {:>8} {:>9} {:>8} {:>6}",
        "policy",
        "cost $",
        "x bound",
        "p50 s",
        "p95 s",
        "reclaimed",
        "noticed",
        "killed",
        "lost GPUh",
        "launchF",
        "never"
    );
    for (name, lb) in
        [("lower-bound spot", &cmp.lower_bound_spot), ("lower-bound on-demand", &cmp.lower_bound_on_demand)]
    {
        println!(
            "{:<26} {:>9.0} {:>8.2} {:>7} {:>7} {:>9} {:>8} {:>8} {:>9} {:>8} {:>6}",
            name,
            lb.cost,
            lb.cost / cmp.lower_bound_spot.cost,
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-"
        );
    }
    for (name, r) in &cmp.runs {
        println!(
            "{:<26} {:>9.0} {:>8.2} {:>7.0} {:>7.0} {:>9} {:>8} {:>8} {:>9.1} {:>8} {:>6}",
            name,
            r.cost,
            r.cost / cmp.lower_bound_spot.cost,
            r.pending_p50,
            r.pending_p95,
            r.reclaimed,
            r.notices_handled,
            r.killed_without_notice,
            r.work_lost_gpu_hours,
            r.launch_failures,
            r.never_ran
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn spot_summary(jobs: &autoscale::Jobs, cmp: &autoscale::SpotComparison) -> serde_json::Value {
    serde_json::json!({
        "pods": jobs.jobs.len(),
        "windowStartSeconds": jobs.start,
        "windowSeconds": jobs.length,
        "lowerBoundSpot": cmp.lower_bound_spot,
        "lowerBoundOnDemand": cmp.lower_bound_on_demand,
        "runs": cmp.runs.iter().map(|(name, r)| serde_json::json!({
            "run": name,
            "cost": r.cost,
            "pendingP50": r.pending_p50,
            "pendingP95": r.pending_p95,
            "reclaimed": r.reclaimed,
            "noticesHandled": r.notices_handled,
            "killedWithoutNotice": r.killed_without_notice,
            "workLostGpuHours": r.work_lost_gpu_hours,
            "launchFailures": r.launch_failures,
            "disrupted": r.disrupted,
            "neverRan": r.never_ran,
        })).collect::<Vec<_>>(),
    })
}

fn print_table(pods: &Path, jobs: &autoscale::Jobs, cmp: &Comparison) {
    println!(
        "trace {}: {} pods in a {:.1} h window from t={} s ({} pods without times skipped)",
        pods.display(),
        jobs.jobs.len(),
        jobs.length as f64 / 3600.0,
        jobs.start,
        jobs.skipped_without_times
    );
    println!(
        "{:<12} {:>10} {:>10} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}",
        "policy",
        "cost $",
        "GPU-h",
        "x bound",
        "alloc",
        "p50 s",
        "p95 s",
        "p99 s",
        "actions",
        "disrupted",
        "never ran"
    );
    println!(
        "{:<12} {:>10.0} {:>10.1} {:>8.2} {:>7} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}",
        "lower-bound",
        cmp.lower_bound.cost,
        cmp.lower_bound.gpu_hours,
        1.0,
        "1.00",
        "-",
        "-",
        "-",
        "-",
        "-",
        "-"
    );
    for r in &cmp.runs {
        println!(
            "{:<12} {:>10.0} {:>10.1} {:>8.2} {:>7.2} {:>8.0} {:>8.0} {:>8.0} {:>8} {:>10} {:>10}",
            r.policy.name(),
            r.cost,
            r.gpu_hours,
            r.cost / cmp.lower_bound.cost,
            r.mean_allocation,
            r.pending_p50,
            r.pending_p95,
            r.pending_p99,
            r.scale_actions,
            r.disrupted,
            r.never_ran
        );
    }
}

fn write_csv(path: &Path, cmp: &Comparison) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut header = vec!["time_s".to_string()];
    for r in &cmp.runs {
        let p = r.policy.name();
        for col in ["capacity_gpus", "allocated_gpus", "demanded_gpus", "pending_pods"] {
            header.push(format!("{p}_{col}"));
        }
    }
    writeln!(f, "{}", header.join(","))?;
    let n = cmp.runs.iter().map(|r| r.samples.len()).min().unwrap_or(0);
    for k in 0..n {
        let mut row = vec![cmp.runs[0].samples[k].time.to_string()];
        for r in &cmp.runs {
            let s = &r.samples[k];
            row.push(format!("{}", s.capacity_gpus));
            row.push(format!("{:.3}", s.allocated_gpus));
            row.push(format!("{:.3}", s.demanded_gpus));
            row.push(s.pending.to_string());
        }
        writeln!(f, "{}", row.join(","))?;
    }
    f.flush().with_context(|| format!("writing {}", path.display()))
}

fn write_svg(path: &Path, cmp: &Comparison, length: u64) -> anyhow::Result<()> {
    let hours = |t: u64| t as f64 / 3600.0;
    let mut series: Vec<(String, Vec<(f64, f64)>)> = cmp
        .runs
        .iter()
        .map(|r| {
            (
                format!("{} capacity", r.policy.name()),
                r.samples.iter().map(|s| (hours(s.time), s.capacity_gpus)).collect(),
            )
        })
        .collect();
    if let Some(r) = cmp.runs.first() {
        series.push((
            "demand (GPUs of running + pending pods, gpuscale run)".to_string(),
            r.samples.iter().map(|s| (hours(s.time), s.demanded_gpus)).collect(),
        ));
    }
    super::plot::line_chart(
        path,
        "GPU capacity vs demand",
        "hours into the window",
        "GPUs",
        (0.0, hours(length).max(1e-3)),
        &series,
    )
}
