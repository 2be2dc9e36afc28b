//! Property test over snapshot bytes: real-shaped snapshots (the embedded example as JSON, and a
//! YAML manifest) mutated byte-wise (flips, truncation, insertion, duplication of a span) go
//! through the whole `plan --snapshot` path in process — reading, conversion, planning — and
//! either plan or fail with an error; never a panic, never an unbounded allocation. CI runs the
//! default case count; `PROPTEST_CASES=100000 cargo test --test fuzz_snapshot` runs longer.

use gpuscale::k8s::{convert, parse_text};
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use gpuscale::textfile::{read_text, InputLimits};
use proptest::prelude::*;
use std::path::Path;

const JSON: &str = include_str!("../examples/snapshots/mixed-gpu-cluster.json");
const YAML: &str = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: a100-1\n    labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB, nvidia.com/mig.strategy: mixed, nvidia.com/gpu.count: \"2\"}\n  status:\n    allocatable: {cpu: \"96\", memory: 1100Gi, pods: \"110\", nvidia.com/mig-3g.20gb: \"4\"}\n    conditions: [{type: Ready, status: \"True\"}]\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: p, namespace: ml, labels: {app: x}}\n  spec:\n    nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB}\n    containers:\n    - name: c\n      resources:\n        limits: {nvidia.com/mig-3g.20gb: \"1\", cpu: \"2\"}\n  status: {phase: Pending}\n";

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Repeat(usize, usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..64, 1u8..20).prop_map(|(i, len, n)| Mutation::Repeat(i, len, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Flip(i, b) => {
            let i = i % bytes.len();
            bytes[i] = *b;
        }
        Mutation::Truncate(i) => bytes.truncate(i % bytes.len()),
        Mutation::Insert(i, v) => {
            let i = i % bytes.len();
            bytes.splice(i..i, v.iter().copied());
        }
        Mutation::Repeat(i, len, n) => {
            let i = i % bytes.len();
            let span: Vec<u8> = bytes[i..(i + len).min(bytes.len())].to_vec();
            for _ in 0..*n {
                bytes.splice(i..i, span.iter().copied());
            }
        }
    }
}

/// The `plan --snapshot` path for `bytes` read as `name`.
fn plan_bytes(name: &str, bytes: &[u8]) {
    let Ok(text) = read_text(bytes, InputLimits::default()) else { return };
    let Ok(objects) = parse_text(Path::new(name), &text) else { return };
    let Ok(loaded) = convert(&objects) else { return };
    let input = PlanInput { snapshot: loaded.snapshot, ..Default::default() };
    let plan = planner::plan(&input, &PlannerSettings::default());
    let _ = plan.to_table();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_json_snapshots_plan_or_fail_cleanly(ms in proptest::collection::vec(mutation(), 1..6)) {
        let mut bytes = JSON.as_bytes().to_vec();
        for m in &ms {
            apply(&mut bytes, m);
        }
        plan_bytes("snapshot.json", &bytes);
    }

    #[test]
    fn mutated_yaml_snapshots_plan_or_fail_cleanly(ms in proptest::collection::vec(mutation(), 1..6)) {
        let mut bytes = YAML.as_bytes().to_vec();
        for m in &ms {
            apply(&mut bytes, m);
        }
        plan_bytes("snapshot.yaml", &bytes);
    }
}

#[test]
fn the_unmutated_inputs_plan() {
    for (name, text) in [("snapshot.json", JSON), ("snapshot.yaml", YAML)] {
        let objects = parse_text(Path::new(name), text).unwrap();
        let loaded = convert(&objects).unwrap();
        assert!(!loaded.snapshot.nodes.is_empty(), "{name}");
    }
}
