//! The autoscaling replay: gpuscale's planner, the Cluster-Autoscaler-like baseline, the static
//! peak cluster and the lower bound, on small synthetic traces and a slice of the openb trace.

use gpuscale::model::{GpuDemand, Resources, Workload};
use gpuscale::sim::autoscale::{self, AutoscaleConfig, Autoscaler, Job, Jobs};
use gpuscale::trace::openb;
use std::path::PathBuf;

fn pod(id: &str, cpu: u64, mem_mib: u64, gpu: GpuDemand) -> Workload {
    Workload { id: id.into(), requests: Resources::new(cpu, mem_mib), gpu, ..Default::default() }
}

fn frac(milli: u32) -> GpuDemand {
    GpuDemand::Fraction { count: 1, milli, memory_mib: 0 }
}

fn jobs(list: Vec<(Workload, u64, u64)>, hours: u64) -> Jobs {
    let mut jobs: Vec<Job> =
        list.into_iter().map(|(workload, arrival, duration)| Job { workload, arrival, duration }).collect();
    jobs.sort_by_key(|j| j.arrival);
    Jobs { jobs, skipped_without_times: 0, start: 0, length: hours * 3600 }
}

fn trace_dir() -> PathBuf {
    let candidates = [
        std::env::var_os("OPENB_TRACE_DIR").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/openb")),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/openb")),
    ];
    candidates.into_iter().flatten().find(|d| d.join("openb_pod_list_default.csv").exists()).expect(
        "the openb trace is not at ../shared/traces/openb or ../../shared/traces/openb (set OPENB_TRACE_DIR)",
    )
}

#[test]
fn burst_scales_up_then_down_and_costs_at_least_the_bound() {
    let (groups, _) = autoscale::openb_groups().unwrap();
    // 20 fractional pods for 1 h, then nothing for 3 h.
    let list = (0..20).map(|k| (pod(&format!("p{k}"), 4000, 8192, frac(500)), 60 + k, 3600)).collect();
    let jobs = jobs(list, 4);
    let cfg = AutoscaleConfig { seed: 3, ..Default::default() };
    let cmp = autoscale::compare(&jobs, &groups, &cfg);
    // 10 GPU-hours at the cheapest $/GPU (V100M16: 3.781 / 4).
    assert!((cmp.lower_bound.gpu_hours - 10.0).abs() < 1e-9, "{:?}", cmp.lower_bound);
    assert!((cmp.lower_bound.cost - 10.0 * 3.781 / 4.0).abs() < 1e-6, "{:?}", cmp.lower_bound);
    for run in &cmp.runs {
        assert_eq!(run.ran, 20, "{:?}: every pod runs", run.policy);
        assert_eq!(run.never_ran, 0);
        assert!(run.cost >= cmp.lower_bound.cost - 1e-9, "{:?} {} < bound", run.policy, run.cost);
    }
    let gs = &cmp.runs[0];
    assert_eq!(gs.policy, Autoscaler::Gpuscale);
    // Capacity rises for the burst and is gone at the end (scale-down after 10 minutes unneeded).
    assert!(gs.samples.iter().any(|s| s.capacity_gpus >= 8.0));
    assert_eq!(gs.samples.last().unwrap().capacity_gpus, 0.0, "gpuscale scales back to zero");
    // Boot delay: the first pods wait at least the 120 s boot.
    assert!(gs.pending_p50 >= 60.0, "{}", gs.pending_p50);
    let ca = &cmp.runs[1];
    assert_eq!(ca.samples.last().unwrap().capacity_gpus, 0.0, "the CA-like baseline scales back to zero");
    // The static cluster never scales and holds the peak (10 GPUs worth of halves).
    let st = &cmp.runs[2];
    assert_eq!(st.scale_actions, 0);
    assert!(st.samples.iter().all(|s| s.capacity_gpus == st.samples[0].capacity_gpus));
    assert!(st.samples[0].capacity_gpus >= 10.0);
}

/// The replay runs the controller's decision step with the controller's settings: the same
/// defaults (one place: `planner::decide::DecideSettings`, which `controller:` overrides).
#[test]
fn the_replay_decides_with_the_controllers_settings() {
    let controller = gpuscale::controller::config::ControllerConfig::default();
    assert_eq!(AutoscaleConfig::default().decide, controller.decide_settings());
}

/// A scripted scenario through the replay: the exact commands of the decision step the controller
/// runs. One whole-GPU pod arriving at 0 and running 30 min: the cheapest group that holds it
/// (V100M16) is raised at once; the node is Ready after the 120 s boot, the pod runs until
/// 120 + 1800 = 1920 s, and the empty node is drained 600 s (`scaleDownUnneededSeconds`) later, at
/// 2520 s, as the controller would (the replay's own rule, removing an empty node after the boot
/// time, is gone).
#[test]
fn a_scripted_scenario_gives_the_controllers_commands() {
    use gpuscale::planner::decide::Command;
    let (groups, mut cloud) = autoscale::openb_groups().unwrap();
    cloud.capacity_error_rate = 0.0;
    let w = pod("p0", 8000, 16384, GpuDemand::Whole { count: 1 });
    let jobs = jobs(vec![(w, 0, 1800)], 1);
    let cfg = AutoscaleConfig { cloud, consolidation: false, ..Default::default() };
    let run = autoscale::run(&jobs, &groups, Autoscaler::Gpuscale, &cfg);
    let v100 = groups.iter().find(|g| g.instance_type == "openb-v100m16").unwrap().id.clone();
    let node = match run.commands.iter().find(|(_, c)| matches!(c, Command::DrainNode { .. })) {
        Some((_, Command::DrainNode { node, .. })) => node.clone(),
        _ => panic!("no drain: {:?}", run.commands),
    };
    let reason = |c: &Command| match c {
        Command::DrainNode { reason, .. } => reason.clone(),
        _ => String::new(),
    };
    let drain_reason = reason(&run.commands[1].1);
    assert_eq!(
        run.commands,
        vec![
            (0, Command::ScaleGroup { group: v100, from: 0, to: 1, pods: vec!["p0".into()], gang: false }),
            (2520, Command::DrainNode { node: node.clone(), reason: drain_reason }),
            (2520, Command::AdvanceDrain { node, wanted: true }),
        ]
    );
    assert_eq!(run.samples.last().unwrap().capacity_gpus, 0.0);
}

#[test]
fn ca_whole_gpu_view_buys_more_than_gpuscale_for_fractional_pods() {
    let (groups, _) = autoscale::openb_groups().unwrap();
    // 32 quarter-GPU pods: 8 GPUs of demand, 32 GPUs in CA's whole-GPU view.
    let list = (0..32).map(|k| (pod(&format!("q{k}"), 1000, 2048, frac(250)), 0, 7200)).collect();
    let jobs = jobs(list, 2);
    let cmp = autoscale::compare(&jobs, &groups, &AutoscaleConfig::default());
    let (gs, ca) = (&cmp.runs[0], &cmp.runs[1]);
    let peak = |r: &autoscale::PolicyRun| r.samples.iter().map(|s| s.capacity_gpus).fold(0.0, f64::max);
    assert!(peak(gs) <= 8.0, "gpuscale packs quarters: {}", peak(gs));
    assert!(peak(ca) > peak(gs), "CA estimates whole GPUs: {} vs {}", peak(ca), peak(gs));
    assert!(gs.cost < ca.cost);
}

#[test]
fn pods_without_times_are_skipped_and_counted() {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        f.path(),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
         a,1000,1024,1,500,,LS,Running,100,4000,100\n\
         b,1000,1024,1,1000,,LS,Running,,,\n\
         c,1000,1024,1,1000,,LS,Running,50,7300,50\n\
         d,1000,1024,1,1000,,LS,Running,9000,9900,9000\n",
    )
    .unwrap();
    let pods = openb::read_pods(f.path()).unwrap();
    let jobs = autoscale::jobs_from_openb(&pods, None, 2.0);
    assert_eq!(jobs.skipped_without_times, 1);
    assert_eq!(jobs.start, 50);
    let ids: Vec<&str> = jobs.jobs.iter().map(|j| j.workload.id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}: d arrives after the 2 h window");
    assert_eq!((jobs.jobs[0].arrival, jobs.jobs[0].duration), (0, 7250));
    assert_eq!((jobs.jobs[1].arrival, jobs.jobs[1].duration), (50, 3900));
    // A window starting later: c is already running and arrives at the start with its remainder.
    let later = autoscale::jobs_from_openb(&pods, Some(3000), 1.0);
    let c = later.jobs.iter().find(|j| j.workload.id.ends_with('c')).unwrap();
    assert_eq!((c.arrival, c.duration), (0, 4300));
}

#[test]
fn default_window_is_the_hour_aligned_window_with_most_gpu_demand() {
    let f = tempfile::NamedTempFile::new().unwrap();
    // A lone pod in hour 0; a burst of 8 GPUs in hours 5-6; a CPU-only pod that must not count.
    std::fs::write(
        f.path(),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
         lone,1000,1024,1,500,,LS,Running,100,4000,100\n\
         b1,1000,1024,4,1000,,LS,Running,19000,25000,19000\n\
         b2,1000,1024,4,1000,,LS,Running,21000,24000,21000\n\
         cpu,64000,1024,0,0,,LS,Running,40000,90000,40000\n",
    )
    .unwrap();
    let pods = openb::read_pods(f.path()).unwrap();
    // One-hour window: hour 5 (18000..21600) holds 4 GPUs x 2600 s + 4 x 600 s; hour 6 holds
    // 4 x 3400 s + 4 x 2400 s, the most.
    assert_eq!(autoscale::busiest_window_start(&pods, 1.0), 21600);
    // A window as long as the trace starts at its first hour.
    assert_eq!(autoscale::busiest_window_start(&pods, 30.0), 0);
    assert_eq!(autoscale::busiest_window_start(&[], 24.0), 0);
}

#[test]
fn openb_slice_is_sane_and_deterministic() {
    let pods = openb::read_pods(&trace_dir().join("openb_pod_list_default.csv")).unwrap();
    let (groups, _) = autoscale::openb_groups().unwrap();
    // Six busy hours of day 130.
    let jobs = autoscale::jobs_from_openb(&pods, Some(130 * 86400), 6.0);
    assert!(jobs.jobs.len() > 100, "{} jobs", jobs.jobs.len());
    let cfg = AutoscaleConfig { seed: 7, ..Default::default() };
    let cmp = autoscale::compare(&jobs, &groups, &cfg);
    let lb = cmp.lower_bound.cost;
    assert!(lb > 0.0);
    for run in &cmp.runs {
        eprintln!(
            "{:>12}: ${:.0} ({:.2}x bound) alloc {:.2} p50/p95/p99 {}/{}/{} s, actions {}, disrupted {}, ran {}, never {}",
            run.policy.name(),
            run.cost,
            run.cost / lb,
            run.mean_allocation,
            run.pending_p50,
            run.pending_p95,
            run.pending_p99,
            run.scale_actions,
            run.disrupted,
            run.ran,
            run.never_ran
        );
        assert!(run.cost >= lb, "{:?} cost {} below the lower bound {lb}", run.policy, run.cost);
        assert_eq!(
            run.ran + run.never_ran,
            jobs.jobs.len(),
            "{:?}: every pod runs or is reported",
            run.policy
        );
    }
    let again = autoscale::run(&jobs, &groups, Autoscaler::Gpuscale, &cfg);
    assert_eq!(again.cost, cmp.runs[0].cost, "same seed, same run");
    assert_eq!(again.samples, cmp.runs[0].samples);
    let ca_again = autoscale::run(&jobs, &groups, Autoscaler::ClusterAutoscaler, &cfg);
    assert_eq!(ca_again.samples, cmp.runs[1].samples);
}

// Runs the binary, which needs the `cli` feature.
#[cfg(feature = "cli")]
#[test]
fn cli_writes_table_csv_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("pods.csv");
    let mut csv = String::from(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n",
    );
    for k in 0..12 {
        csv.push_str(&format!(
            "p{k},4000,8192,1,{},,LS,Running,{},{},0\n",
            250 + 50 * k,
            100 * k,
            100 * k + 1800
        ));
    }
    csv.push_str("late,4000,8192,1,1000,,LS,Running,,,\n");
    std::fs::write(&trace, csv).unwrap();
    let out = dir.path().join("out");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["simulate", "--autoscale", "--window-hours", "1", "--seed", "5", "--pods"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("12 pods") && stdout.contains("1 pods without times skipped"), "{stdout}");
    for p in ["lower-bound", "gpuscale", "ca-like", "static-peak"] {
        assert!(stdout.contains(p), "{p} missing:\n{stdout}");
    }
    let csv = std::fs::read_to_string(out.join("autoscale.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("time_s,gpuscale_capacity_gpus,gpuscale_allocated_gpus,gpuscale_demanded_gpus")
    );
    assert_eq!(csv.lines().count(), 1 + 360, "one row per 10 s loop over 1 h");
    let svg = std::fs::read_to_string(out.join("autoscale.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("gpuscale capacity"));
}

/// The targets on the default replay (the busiest day of the openb default trace, the
/// embedded groups, default settings): at most 1.25x the lower bound and at least 25% below the
/// Cluster-Autoscaler-like baseline at equal or better p95 pending time. Since the replay runs the
/// controller's decision step (empty nodes kept the controller's 10 minutes, not the boot time) the
/// margin is thin on this seed (1.225x, 25.1%) and the 25% target is missed on cloud seeds 1, 3
/// and 5 (docs/autoscaling-replay.md); the test holds the product to the target on the published
/// seed rather than relaxing it.
#[test]
fn default_replay_meets_the_cost_targets() {
    let pods = openb::read_pods(&trace_dir().join("openb_pod_list_default.csv")).unwrap();
    let (groups, cloud) = autoscale::openb_groups().unwrap();
    let jobs = autoscale::jobs_from_openb(&pods, Some(autoscale::busiest_window_start(&pods, 24.0)), 24.0);
    let cmp = autoscale::compare(&jobs, &groups, &AutoscaleConfig { cloud, ..Default::default() });
    let run = |p: Autoscaler| cmp.runs.iter().find(|r| r.policy == p).unwrap();
    let (gs, ca) = (run(Autoscaler::Gpuscale), run(Autoscaler::ClusterAutoscaler));
    let bound = cmp.lower_bound.cost;
    eprintln!(
        "gpuscale ${:.0} ({:.3}x, p95 {} s), ca-like ${:.0} ({:.3}x, p95 {} s)",
        gs.cost,
        gs.cost / bound,
        gs.pending_p95,
        ca.cost,
        ca.cost / bound,
        ca.pending_p95
    );
    assert!(gs.cost <= 1.25 * bound, "{:.3}x the bound", gs.cost / bound);
    assert!(gs.cost <= 0.75 * ca.cost, "only {:.1}% below CA-like", 100.0 * (1.0 - gs.cost / ca.cost));
    assert!(gs.pending_p95 <= ca.pending_p95, "p95 {} s vs {} s", gs.pending_p95, ca.pending_p95);
    assert_eq!(gs.never_ran, 0);
}

/// The replay with spot interruptions: gpuscale reads the notices and moves every pod off a
/// noticed node before the reclaim (none killed), the CA-like baseline sees no notices and loses
/// pods with their nodes; spot costs well under on-demand; the same seed gives the same figures.
#[test]
fn spot_interruptions_kill_no_pod_on_a_noticed_node() {
    let (groups, _) = autoscale::openb_groups().unwrap();
    let list = (0..24)
        .map(|k| (pod(&format!("p{k}"), 4000, 8192, GpuDemand::Whole { count: 1 }), 60 + 30 * k, 5 * 3600))
        .collect();
    let jobs = jobs(list, 6);
    let mut cfg = AutoscaleConfig { seed: 5, ..Default::default() };
    cfg.cloud.spot_interruptions_per_hour = 0.3;
    cfg.cloud.interruption_notice = std::time::Duration::from_secs(120);
    cfg.cloud.spot_capacity_error_rate = Some(0.1);
    let cmp = autoscale::compare_spot(&jobs, &groups, 0.35, &cfg);
    let by = |name: &str| &cmp.runs.iter().find(|(n, _)| n == name).unwrap().1;
    let (gs, od, ca) = (by("gpuscale spot"), by("gpuscale on-demand"), by("ca-like spot"));
    assert!(gs.reclaimed + gs.notices_handled > 0, "no interruption drawn: {gs:?}");
    assert!(gs.notices_handled > 0);
    assert_eq!(gs.killed_without_notice, 0, "a pod died with its noticed node");
    assert!(ca.killed_without_notice > 0, "the baseline sees no notices");
    assert_eq!(od.reclaimed + od.killed_without_notice, 0, "on-demand is never interrupted");
    assert!(gs.cost < 0.6 * od.cost, "spot {} vs on-demand {}", gs.cost, od.cost);
    assert!(gs.cost >= cmp.lower_bound_spot.cost - 1e-9);
    for (name, r) in &cmp.runs {
        assert_eq!(r.never_ran, 0, "{name}");
    }
    let again = autoscale::compare_spot(&jobs, &groups, 0.35, &cfg);
    assert_eq!(again.runs[0].1.cost, gs.cost, "deterministic given the seed");
}
