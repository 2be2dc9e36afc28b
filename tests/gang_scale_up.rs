//! Atomic gang scale-up against the simulated cloud: all or nothing, nothing left billing.

use gpuscale::model::InstanceState;
use gpuscale::providers::config;
use gpuscale::providers::gang::{
    prepare_gang, resume_gang, run_gang, scale_up_gang, GangOutcome, GroupGrowth,
};
use gpuscale::providers::simulated::Operation;
use gpuscale::providers::simulated::{SimulatedCloud, SimulationSettings};
use std::cell::Cell;
use std::time::Duration;

const GROUPS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: h100-a, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 8, targetSize: 1}
      - {name: h100-b, instanceType: p5.48xlarge, zones: [us-east-1b], minSize: 0, maxSize: 8, targetSize: 0}
"#;

fn cloud() -> SimulatedCloud {
    let groups = config::load_strs(&[("gang.yaml", GROUPS)]).unwrap().node_groups();
    let settings = SimulationSettings {
        boot: Duration::from_secs(120),
        capacity_error_rate: 0.0,
        spot_interruptions_per_hour: 0.0,
        ..Default::default()
    };
    let cloud = SimulatedCloud::new("sim", groups, settings);
    // The group's existing node is up.
    cloud.advance(Duration::from_secs(600));
    cloud
}

fn growth() -> Vec<GroupGrowth> {
    vec![GroupGrowth { group: "sim/h100-a".into(), to: 3 }, GroupGrowth { group: "sim/h100-b".into(), to: 2 }]
}

fn live(cloud: &SimulatedCloud, group: &str) -> usize {
    let groups = cloud.snapshot();
    let g = groups.iter().find(|g| g.id == group).unwrap();
    g.instances.iter().filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running)).count()
}

#[tokio::test]
async fn a_gang_whose_instances_all_come_up_is_ready() {
    let cloud = cloud();
    let outcome = scale_up_gang(&cloud, &growth(), Duration::from_secs(900), Duration::from_secs(30), |d| {
        cloud.advance(d);
        std::future::ready(())
    })
    .await
    .unwrap();
    let GangOutcome::Ready { instances } = outcome else { panic!("{outcome:?}") };
    assert_eq!(instances["sim/h100-a"].len(), 2);
    assert_eq!(instances["sim/h100-b"].len(), 2);
    assert_eq!((live(&cloud, "sim/h100-a"), live(&cloud, "sim/h100-b")), (3, 2));
}

#[tokio::test]
async fn a_partial_gang_is_rolled_back_and_nothing_is_left_billing() {
    let cloud = cloud();
    // Zone b has room for one more p5, the gang needs two there.
    cloud.set_zone_capacity("us-east-1b", Some(1));
    let outcome = scale_up_gang(&cloud, &growth(), Duration::from_secs(900), Duration::from_secs(30), |d| {
        cloud.advance(d);
        std::future::ready(())
    })
    .await
    .unwrap();
    let GangOutcome::RolledBack { reason, deleted } = outcome else { panic!("{outcome:?}") };
    assert!(reason.contains("sim/h100-b: 1/2 running"), "{reason}");
    assert_eq!(deleted["sim/h100-a"].len(), 2);
    assert_eq!(deleted["sim/h100-b"].len(), 1);
    // Only the node that existed before is left, and the targets are back where they were.
    cloud.advance(Duration::from_secs(600));
    assert_eq!((live(&cloud, "sim/h100-a"), live(&cloud, "sim/h100-b")), (1, 0));
    let groups = cloud.snapshot();
    let targets: Vec<u32> = groups.iter().map(|g| g.target_size).collect();
    assert_eq!(targets, vec![1, 0]);
}

#[tokio::test]
async fn an_unknown_group_is_refused_before_anything_scales() {
    let cloud = cloud();
    let err = scale_up_gang(
        &cloud,
        &[GroupGrowth { group: "sim/h100-a".into(), to: 3 }, GroupGrowth { group: "sim/nope".into(), to: 1 }],
        Duration::from_secs(60),
        Duration::from_secs(30),
        |_| std::future::ready(()),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("sim/nope"));
    assert_eq!(live(&cloud, "sim/h100-a"), 1);
}

fn writes(cloud: &SimulatedCloud) -> Vec<Operation> {
    cloud
        .operations()
        .into_iter()
        .map(|r| r.op)
        .filter(|op| matches!(op, Operation::SetTargetSize { .. } | Operation::DeleteInstances { .. }))
        .collect()
}

/// A scale-up whose fence turns false while it waits writes nothing more, and a second process
/// resuming it from its record rolls it back exactly once (never raising again).
#[tokio::test]
async fn a_fenced_gang_stops_and_a_resumed_one_rolls_back_once() {
    let cloud = cloud();
    cloud.set_zone_capacity("us-east-1b", Some(1));
    let timeout = Duration::from_secs(900);
    let record = prepare_gang(&cloud, &growth(), timeout, 1_700_000_000).await.unwrap();
    assert_eq!(record.groups[0].old_target, 1);
    assert_eq!(record.groups[0].existing.len(), 1);
    // The first process leads for three polls, then loses leadership.
    let polls = Cell::new(0);
    let outcome = run_gang(
        &cloud,
        &record,
        true,
        timeout,
        Duration::from_secs(30),
        |d| {
            cloud.advance(d);
            polls.set(polls.get() + 1);
            std::future::ready(())
        },
        || polls.get() < 3,
        |_| async { panic!("a fenced process must not begin the rollback") },
        |_: &str| true,
    )
    .await
    .unwrap();
    assert!(matches!(outcome, GangOutcome::Stopped { .. }), "{outcome:?}");
    let raised = writes(&cloud);
    assert_eq!(raised.len(), 2, "the two raises only: {raised:?}");
    // Long past its timeout, the stopped process has written nothing more.
    cloud.advance(Duration::from_secs(1200));
    assert_eq!(writes(&cloud).len(), 2);

    // The next leader resumes from the record: no time left, so it rolls back, once.
    let marked = Cell::new(0);
    let outcome = resume_gang(
        &cloud,
        &record,
        Duration::ZERO,
        Duration::from_secs(30),
        |d| {
            cloud.advance(d);
            std::future::ready(())
        },
        || true,
        |r| {
            assert!(!r.rolling_back);
            marked.set(marked.get() + 1);
            async { true }
        },
        |_: &str| true,
    )
    .await
    .unwrap();
    let GangOutcome::RolledBack { deleted, .. } = outcome else { panic!("{outcome:?}") };
    assert_eq!(marked.get(), 1, "the rollback is recorded before it starts");
    assert_eq!(deleted["sim/h100-a"].len(), 2);
    assert_eq!(deleted["sim/h100-b"].len(), 1);
    let after = writes(&cloud);
    let raises = after
        .iter()
        .filter(|op| matches!(op, Operation::SetTargetSize { from, to, .. } if to > from))
        .count();
    assert_eq!(raises, 2, "resuming never raises: {after:?}");
    assert_eq!(after.len(), 2 + 2 + 2, "two deletions and two restores: {after:?}");
    cloud.advance(Duration::from_secs(600));
    assert_eq!((live(&cloud, "sim/h100-a"), live(&cloud, "sim/h100-b")), (1, 0));
}

/// The review's finding 1: a rollback used to delete every instance launched since the gang
/// started, with whatever pods kube-scheduler had bound to their nodes. An instance the caller
/// says runs other work is kept, and the group's target keeps room for it (else the cloud would
/// pick another instance to cut the group down with).
#[tokio::test]
async fn a_rollback_keeps_instances_whose_nodes_run_other_pods() {
    let cloud = cloud();
    cloud.set_zone_capacity("us-east-1b", Some(1));
    let timeout = Duration::from_secs(900);
    let record = prepare_gang(&cloud, &growth(), timeout, 1_700_000_000).await.unwrap();
    // The first new h100-a instance (in launch order) is busy with pods that are not the gang's.
    let busy = std::cell::RefCell::new(None::<String>);
    let outcome = run_gang(
        &cloud,
        &record,
        true,
        timeout,
        Duration::from_secs(30),
        |d| {
            cloud.advance(d);
            std::future::ready(())
        },
        || true,
        |_| async { true },
        |id: &str| {
            let mut busy = busy.borrow_mut();
            let first = busy.get_or_insert_with(|| id.to_string());
            first != id
        },
    )
    .await
    .unwrap();
    let GangOutcome::RolledBack { deleted, .. } = outcome else { panic!("{outcome:?}") };
    let kept = busy.borrow().clone().expect("the predicate was asked");
    assert_eq!(deleted["sim/h100-a"].len(), 1, "one of the two new h100-a instances is kept");
    assert!(!deleted["sim/h100-a"].contains(&kept));
    assert_eq!(deleted["sim/h100-b"].len(), 1);
    cloud.advance(Duration::from_secs(600));
    assert_eq!((live(&cloud, "sim/h100-a"), live(&cloud, "sim/h100-b")), (2, 0));
    let groups = cloud.snapshot();
    let a = groups.iter().find(|g| g.id == "sim/h100-a").unwrap();
    assert_eq!(a.target_size, 2, "old target 1 plus the kept instance");
    assert!(a.instances.iter().any(|i| i.id == kept && i.state == InstanceState::Running));
}

#[test]
fn a_record_past_twice_its_timeout_is_stale() {
    let record = gpuscale::providers::gang::GangRecord {
        groups: vec![],
        started_unix: 1_000,
        timeout_seconds: 600.0,
        rolling_back: false,
        pods: Default::default(),
    };
    assert!(!record.is_stale(1_000 + 1_200));
    assert!(record.is_stale(1_000 + 1_201));
}
