//! Provider config files and the instance catalog: parsing, every validation error, templates.

use gpuscale::model::{dollars, mig, CapacityType, GpuCatalog, GpuMode, Resources};
use gpuscale::providers::catalog::{self, GpuSharing};
use gpuscale::providers::config::{
    load_files, load_strs, ConfigError, CredentialSource, ProviderConfig, ProviderKind,
};
use std::collections::BTreeMap;
use std::io::Write;

fn load(text: &str) -> Result<ProviderConfig, ConfigError> {
    load_strs(&[("conf/test.yaml", text)])
}

/// Loads `text` expecting an error whose message names the file, `field` and `value`.
fn expect_error(text: &str, field: &str, value: &str) -> String {
    let err = load(text).expect_err("config should be rejected");
    let msg = err.to_string();
    assert!(msg.contains("conf/test.yaml"), "no file in: {msg}");
    assert!(msg.contains(field), "no field {field:?} in: {msg}");
    assert!(msg.contains(value), "no value {value:?} in: {msg}");
    msg
}

const BASE_GROUP: &str = "
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        maxSize: 4
";

fn sim(groups: &str) -> String {
    format!(
        "accounts:\n  - name: sim\n    provider: simulated\n    region: us-east-1\n    nodeGroups:{groups}"
    )
}

#[test]
fn example_files_load() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/providers");
    let cfg =
        load_files(&[format!("{dir}/aws.yaml"), format!("{dir}/gcp.yaml"), format!("{dir}/simulated.yaml")])
            .unwrap();
    assert_eq!(cfg.accounts.len(), 4);
    assert_eq!(cfg.sources[3].file_name().unwrap(), "simulated.yaml");
    let prod = cfg.account("prod-aws").unwrap();
    assert_eq!(
        prod.credential_source(),
        CredentialSource::AssumeRole {
            role_arn: "arn:aws:iam::123456789012:role/gpuscale".into(),
            external_id: Some("gpuscale-prod".into())
        }
    );
    assert_eq!(
        cfg.account("staging-aws").unwrap().credential_source(),
        CredentialSource::Profile("staging".into())
    );
    assert_eq!(cfg.account("ml-gcp").unwrap().provider, ProviderKind::Gcp);

    let groups = cfg.node_groups();
    let by_id: BTreeMap<_, _> = groups.iter().map(|g| (g.id.as_str(), g)).collect();
    // Price override beats the catalog.
    assert_eq!(by_id["prod-aws/gpu-a100-mig"].price, dollars(19.76));
    // AWS spot group without a spot price: on-demand as the conservative placeholder.
    let l40s = by_id["prod-aws/gpu-l40s-spot"];
    assert_eq!(l40s.capacity_type, CapacityType::Spot);
    assert_eq!(l40s.price, dollars(10.49264));
    assert_eq!(l40s.template.labels["karpenter.sh/capacity-type"], "spot");
    let a100 = by_id["ml-gcp/a100-pool"];
    assert_eq!(a100.template.labels["cloud.google.com/gke-nodepool"], "a100-pool");
    assert_eq!(a100.template.labels["cloud.google.com/gke-accelerator"], "nvidia-tesla-a100");
    assert_eq!(a100.template.labels["nvidia.com/mig-3g.20gb.count"], "16");
    assert_eq!(by_id["ml-gcp/l4-spot-pool"].price, dollars(1.60));
}

#[test]
fn embedded_default_mirrors_the_example_cluster() {
    let cfg = ProviderConfig::embedded_default().unwrap();
    let groups = cfg.node_groups();
    let ids: Vec<&str> = groups.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "sim/gpu-a100-mig",
            "sim/gpu-h100",
            "sim/gpu-l4-ts",
            "sim/gpu-l4-spot",
            "sim/gpu-a10g",
            "sim/cpu-general"
        ]
    );
    let mig = &groups[0];
    assert_eq!(mig.instance_type, "p4d.24xlarge");
    assert_eq!(mig.zones, ["us-east-1a"]);
    assert_eq!(mig.target_size, 2);
    assert_eq!(mig.price, dollars(21.957642));
    assert_eq!(mig.template.node_group.as_deref(), Some("sim/gpu-a100-mig"));
    assert_eq!(mig.template.gpus.len(), 8);
    for gpu in &mig.template.gpus {
        let GpuMode::Mig { instances, dynamic } = &gpu.mode else { panic!("{:?}", gpu.mode) };
        assert!(!dynamic);
        assert_eq!(instances.len(), 7);
        assert!(instances.iter().all(|i| i.placement.profile == "1g.5gb"));
    }
    let ts = &groups[2];
    assert!(ts.template.gpus.iter().all(|g| g.mode == GpuMode::TimeSliced { replicas: 4 }));
    assert_eq!(ts.template.labels["nvidia.com/gpu.product"], "NVIDIA-L4-SHARED");
    assert_eq!(groups[3].capacity_type, CapacityType::Spot);
    assert_eq!(groups[3].price, dollars(2.07));
    assert!(groups[5].template.gpus.is_empty());
    assert_eq!(groups[5].target_size, 3);
}

#[test]
fn template_nodes_follow_the_catalog() {
    let no_labels = BTreeMap::new();
    for spec in catalog::all() {
        let zone = match spec.cloud {
            catalog::Cloud::Aws => "us-east-1a",
            catalog::Cloud::Gcp => "us-central1-a",
        };
        let node = catalog::template_node(spec, zone, &no_labels, &[], &GpuSharing::None).unwrap();
        let capacity = Resources::new(u64::from(spec.vcpu) * 1000, spec.memory_mib);
        assert!(node.allocatable.fits_in(&capacity), "{}", spec.instance_type);
        assert!(node.allocatable.cpu_milli < capacity.cpu_milli, "{}", spec.instance_type);
        assert!(node.allocatable.memory_bytes < capacity.memory_bytes, "{}", spec.instance_type);
        assert_eq!(node.gpus.len(), spec.gpus as usize, "{}", spec.instance_type);
        assert_eq!(node.labels["node.kubernetes.io/instance-type"], spec.instance_type);
        assert_eq!(node.labels["topology.kubernetes.io/zone"], zone);
        if let Some(model) = &spec.gpu_model {
            let m = GpuCatalog.resolve(model).unwrap();
            assert_eq!(node.gpu_model.as_deref(), Some(m.name));
            assert!(node.gpus.iter().all(|g| g.memory_mib == m.memory_mib));
            assert_eq!(node.labels["nvidia.com/gpu.count"], spec.gpus.to_string());
            // The product label GFD sets resolves back to the same model.
            let product = &node.labels["nvidia.com/gpu.product"];
            assert_eq!(GpuCatalog.resolve(product).unwrap().name, m.name, "{product}");
            assert_eq!(
                !node.topology.nvlink_domain.is_empty(),
                spec.nvlink && spec.gpus > 1,
                "{}",
                spec.instance_type
            );
        } else {
            assert!(node.gpu_model.is_none());
            assert!(!node.labels.contains_key("nvidia.com/gpu.count"));
        }
    }

    // Known values: EKS m6i.large and GKE g2-standard-4.
    let m6i = catalog::lookup("m6i.large").unwrap();
    let node = catalog::template_node(m6i, "us-east-1a", &no_labels, &[], &GpuSharing::None).unwrap();
    assert_eq!(node.allocatable, Resources::new(2000 - 70, 8192 - (11 * 29 + 255) - 100));
    let g2 = catalog::lookup("g2-standard-4").unwrap();
    let node = catalog::template_node(g2, "us-central1-a", &no_labels, &[], &GpuSharing::None).unwrap();
    assert_eq!(node.allocatable, Resources::new(4000 - 80, 16384 - 2663 - 100));
    assert_eq!(node.labels["topology.kubernetes.io/region"], "us-central1");
    assert_eq!(node.labels["nvidia.com/gpu.memory"], "23034");
    assert_eq!(node.max_pods, 110, "GKE Standard's default pod limit");
    let p5 = catalog::lookup("p5.48xlarge").unwrap();
    let node = catalog::template_node(p5, "us-east-1a", &no_labels, &[], &GpuSharing::None).unwrap();
    assert_eq!(node.max_pods, 100, "the EKS ENI table's pod limit");
}

/// A group's `maxPods` and `extendedResources` describe its new nodes; bad ones are errors
/// naming the field and value.
#[test]
fn group_pod_limit_and_extended_resources() {
    let config = load(&sim("
      - name: fabric
        instanceType: p5.48xlarge
        zones: [us-east-1a]
        maxSize: 4
        maxPods: 250
        extendedResources: {vpc.amazonaws.com/efa: 32, rdma/ib: 8}
"))
    .expect("valid config");
    let template = &config.node_groups()[0].template;
    assert_eq!(template.max_pods, 250);
    assert_eq!(template.extended_allocatable["vpc.amazonaws.com/efa"], 32);
    assert_eq!(template.extended_allocatable["rdma/ib"], 8);
    for (line, field, value) in [
        ("maxPods: 0", "maxPods", "0"),
        ("maxPods: 20000", "maxPods", "20000"),
        ("extendedResources: {efa: 1}", "extendedResources.\"efa\"", "1"),
        ("extendedResources: {nvidia.com/gpu: 8}", "extendedResources.\"nvidia.com/gpu\"", "8"),
        ("extendedResources: {example.com/fpga: 0}", "extendedResources.\"example.com/fpga\"", "0"),
    ] {
        let text = sim(&format!("{BASE_GROUP}        {line}\n"));
        expect_error(&text, &format!("accounts[0].nodeGroups[0].{field}"), value);
    }
}

#[test]
fn mig_layouts_are_valid_for_each_model() {
    let p4d = catalog::lookup("p4d.24xlarge").unwrap();
    let p5 = catalog::lookup("p5.48xlarge").unwrap();
    let p5e = catalog::lookup("p5e.48xlarge").unwrap();
    let cases = [
        (p4d, "all-1g.5gb", vec![("1g.5gb", 7)]),
        (p4d, "all-2g.10gb", vec![("2g.10gb", 3)]),
        (p4d, "all-3g.20gb", vec![("3g.20gb", 2)]),
        (p4d, "all-7g.40gb", vec![("7g.40gb", 1)]),
        (p4d, "all-1g.10gb", vec![("1g.10gb", 4)]),
        (p4d, "all-1g.5gb.me", vec![("1g.5gb+me", 1)]),
        (p4d, "all-balanced", vec![("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)]),
        (p5, "all-balanced", vec![("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)]),
        (p5e, "all-1g.18gb", vec![("1g.18gb", 7)]),
    ];
    for (spec, layout, want) in cases {
        let node = catalog::template_node(
            spec,
            "us-east-1a",
            &BTreeMap::new(),
            &[],
            &GpuSharing::Mig(layout.into()),
        )
        .unwrap();
        let geometry = node.mig_geometry().unwrap();
        for gpu in &node.gpus {
            let GpuMode::Mig { instances, .. } = &gpu.mode else { panic!("{layout}: {:?}", gpu.mode) };
            let placements: Vec<mig::MigPlacement> = instances.iter().map(|i| i.placement.clone()).collect();
            assert_eq!(geometry.validate(&placements), Ok(()), "{layout}");
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for p in &placements {
                *counts.entry(p.profile.as_str()).or_default() += 1;
            }
            let want: BTreeMap<&str, usize> = want.iter().copied().collect();
            assert_eq!(counts, want, "{} {layout}", spec.instance_type);
        }
        assert_eq!(node.labels["nvidia.com/mig.config"], layout);
        assert_eq!(node.labels["nvidia.com/mig.strategy"], "mixed");
    }
    // `all-enabled`: MIG mode, instances created on demand.
    let node = catalog::template_node(
        p4d,
        "us-east-1a",
        &BTreeMap::new(),
        &[],
        &GpuSharing::Mig("all-enabled".into()),
    )
    .unwrap();
    assert!(node.gpus.iter().all(|g| matches!(
        &g.mode,
        GpuMode::Mig { instances, dynamic: true } if instances.is_empty()
    )));
}

#[test]
fn custom_instance_spec() {
    let cfg = load(&sim("
      - name: custom
        instanceType: x9.mega
        instanceSpec: {vcpu: 64, memoryGiB: 512, gpus: 4, gpuModel: NVIDIA-A100-SXM4-80GB, nvlink: true, price: {onDemand: 12.5}}
        zones: [us-east-1a]
        maxSize: 2
        gpuSharing: {mig: all-3g.40gb}
"))
    .unwrap();
    let g = &cfg.node_groups()[0];
    assert_eq!(g.price, dollars(12.5));
    assert_eq!(g.template.gpu_model.as_deref(), Some("A100-80GB"));
    assert_eq!(g.template.gpus.len(), 4);
    assert_eq!(g.template.topology.nvlink_domain, vec![0; 4]);
    assert_eq!(g.target_size, 0);
}

#[test]
fn several_accounts_per_file_and_several_files() {
    let a = "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n  - name: b\n    provider: aws\n    region: us-west-2\n";
    let b = "accounts:\n  - name: c\n    provider: gcp\n    project: p\n    region: europe-west4\n";
    let cfg = load_strs(&[("a.yaml", a), ("b.yaml", b)]).unwrap();
    assert_eq!(cfg.accounts.len(), 3);
    assert!(cfg.node_groups().is_empty());

    let dup = "accounts:\n  - name: a\n    provider: gcp\n    project: p\n    region: europe-west4\n";
    let msg = load_strs(&[("a.yaml", a), ("dup.yaml", dup)]).unwrap_err().to_string();
    assert!(msg.contains("dup.yaml"), "{msg}");
    assert!(msg.contains("accounts[0].name"), "{msg}");
    assert!(msg.contains("\"a\""), "{msg}");
    assert!(msg.contains("first declared in a.yaml"), "{msg}");
}

#[test]
fn duplicate_group_names() {
    expect_error(&sim(&format!("{BASE_GROUP}{BASE_GROUP}")), "accounts[0].nodeGroups[1].name", "\"g\"");
}

#[test]
fn min_greater_than_max() {
    expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        minSize: 5
        maxSize: 4
"),
        "accounts[0].nodeGroups[0].minSize",
        "5",
    );
}

#[test]
fn target_outside_bounds() {
    let msg = expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        minSize: 1
        maxSize: 4
        targetSize: 9
"),
        "accounts[0].nodeGroups[0].targetSize",
        "9",
    );
    assert!(msg.contains("[1, 4]"), "{msg}");
}

#[test]
fn a_group_larger_than_any_cluster_is_an_error() {
    let msg = expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        maxSize: 1000000
        targetSize: 1000000
"),
        "accounts[0].nodeGroups[0].maxSize",
        "1000000",
    );
    assert!(msg.contains("15000"), "{msg}");
}

#[test]
fn unknown_instance_type() {
    let msg = expect_error(
        &sim("
      - name: g
        instanceType: g9.huge
        zones: [us-east-1a]
        maxSize: 4
"),
        "accounts[0].nodeGroups[0].instanceType",
        "\"g9.huge\"",
    );
    assert!(msg.contains("instanceSpec"), "{msg}");
}

#[test]
fn unknown_gpu_model() {
    expect_error(
        &sim("
      - name: g
        instanceType: x1.gpu
        instanceSpec: {vcpu: 8, memoryGiB: 64, gpus: 1, gpuModel: Radeon-MI300X, price: {onDemand: 3}}
        zones: [us-east-1a]
        maxSize: 4
"),
        "accounts[0].nodeGroups[0].instanceSpec.gpuModel",
        "\"Radeon-MI300X\"",
    );
}

#[test]
fn invalid_mig_layouts() {
    // A profile of another GPU model.
    let msg = expect_error(
        &sim("
      - name: g
        instanceType: p4d.24xlarge
        zones: [us-east-1a]
        maxSize: 4
        gpuSharing: {mig: all-1g.10gb.me}
"),
        "accounts[0].nodeGroups[0].gpuSharing.mig",
        "\"all-1g.10gb.me\"",
    );
    assert!(msg.contains("A100-40GB"), "{msg}");
    // MIG on a GPU without MIG.
    let msg = expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        maxSize: 4
        gpuSharing: {mig: all-1g.5gb}
"),
        "accounts[0].nodeGroups[0].gpuSharing.mig",
        "\"all-1g.5gb\"",
    );
    assert!(msg.contains("does not support MIG"), "{msg}");
    // Sharing on a CPU type.
    expect_error(
        &sim("
      - name: g
        instanceType: m6i.large
        zones: [us-east-1a]
        maxSize: 4
        gpuSharing: {timeSlicing: {replicas: 2}}
"),
        "accounts[0].nodeGroups[0].gpuSharing.timeSlicing.replicas",
        "replicas: 2",
    );
    expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        maxSize: 4
        gpuSharing: {timeSlicing: {replicas: 0}}
"),
        "accounts[0].nodeGroups[0].gpuSharing.timeSlicing.replicas",
        "replicas: 0",
    );
}

#[test]
fn spot_group_needs_a_spot_price_unless_the_provider_supplies_it() {
    let spot = "
      - name: spotty
        instanceType: g6.xlarge
        zones: [us-east-1a]
        capacityType: spot
        maxSize: 4
";
    let msg = expect_error(&sim(spot), "accounts[0].nodeGroups[0].price.spot", "null");
    assert!(msg.contains("provider simulated cannot supply spot prices"), "{msg}");
    let gcp =
        "accounts:\n  - name: g\n    provider: gcp\n    project: p\n    region: us-central1\n    nodeGroups:
      - name: spotty
        instanceType: g2-standard-4
        zones: [us-central1-a]
        capacityType: spot
        maxSize: 4
";
    expect_error(gcp, "accounts[0].nodeGroups[0].price.spot", "null");
    // priceOverrides supplies it.
    let with_override = format!(
        "accounts:\n  - name: sim\n    provider: simulated\n    region: us-east-1\n    priceOverrides: {{g6.xlarge: {{spot: 0.31}}}}\n    nodeGroups:{spot}"
    );
    assert_eq!(load(&with_override).unwrap().node_groups()[0].price, dollars(0.31));
    // AWS can look spot prices up.
    let aws =
        format!("accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    nodeGroups:{spot}");
    assert_eq!(load(&aws).unwrap().node_groups()[0].price, dollars(0.8048));
}

#[test]
fn missing_on_demand_price() {
    expect_error(
        &sim("
      - name: h200
        instanceType: p5e.48xlarge
        zones: [us-east-1a]
        maxSize: 2
"),
        "accounts[0].nodeGroups[0].price.onDemand",
        "null",
    );
}

#[test]
fn malformed_yaml_reports_line_and_column() {
    let err = load("accounts:\n  - name: a\n    provider: [aws\n").unwrap_err();
    let ConfigError::Yaml { line, column, .. } = &err else { panic!("{err}") };
    assert!(*line >= 3 && *column > 0, "{err}");
    assert!(err.to_string().starts_with("conf/test.yaml:"), "{err}");
}

#[test]
fn unknown_keys_are_rejected_with_their_path() {
    let msg = expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-east-1a]
        maxSize: 4
        maxSzie: 5
"),
        "nodeGroups[0]",
        "maxSzie",
    );
    assert!(msg.contains("test.yaml:10:9:"), "the position leads the message: {msg}");
    expect_error(
        "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    rateLimit: {rps: 3}\n",
        "rateLimit",
        "rps",
    );
    expect_error("accounts:\n  - name: a\n    provider: azure\n", "provider", "azure");
}

#[test]
fn empty_files() {
    for text in ["", "# only a comment\n", "\n\n"] {
        let err = load(text).unwrap_err();
        assert!(matches!(err, ConfigError::Empty { .. }), "{err}");
        assert!(err.to_string().contains("conf/test.yaml"));
    }
    expect_error("accounts: []\n", "accounts", "[]");
}

#[test]
fn account_level_validation() {
    expect_error("accounts:\n  - name: a\n    provider: aws\n", "accounts[0].region", "null");
    expect_error(
        "accounts:\n  - name: g\n    provider: gcp\n    region: us-central1\n",
        "accounts[0].project",
        "None",
    );
    expect_error("accounts:\n  - name: s\n    provider: simulated\n", "accounts[0].nodeGroups", "[]");
    expect_error(
        "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    credentials: {profile: p, env: true}\n",
        "accounts[0].credentials",
        "profile, env",
    );
    expect_error(
        "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    credentials: {serviceAccountKeyFile: /k.json}\n",
        "accounts[0].credentials.serviceAccountKeyFile",
        "/k.json",
    );
    expect_error(
        "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    rateLimit: {requestsPerSecond: 0, burst: 5}\n",
        "accounts[0].rateLimit.requestsPerSecond",
        "0",
    );
    expect_error(
        "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    endpointUrl: localhost:5000\n",
        "accounts[0].endpointUrl",
        "localhost:5000",
    );
    expect_error(
        &sim(BASE_GROUP)
            .replace("region: us-east-1\n", "region: us-east-1\n    simulation: {capacityErrorRate: 1.5}\n"),
        "accounts[0].simulation.capacityErrorRate",
        "1.5",
    );
    expect_error(
        &sim("
      - name: g
        instanceType: g6.xlarge
        zones: [us-west-2a]
        maxSize: 4
"),
        "accounts[0].nodeGroups[0].zones[0]",
        "us-west-2a",
    );
    expect_error(
        "accounts:\n  - name: g\n    provider: gcp\n    project: p\n    region: us-central1\n    nodeGroups:\n      - {name: x, instanceType: p4d.24xlarge, zones: [us-central1-a], maxSize: 1}\n",
        "accounts[0].nodeGroups[0].instanceType",
        "p4d.24xlarge",
    );
}

#[test]
fn the_interruption_queue_is_an_aws_setting_with_a_queue_name_or_url() {
    for queue in ["gpuscale-interruptions", "q_1.fifo", "https://sqs.us-east-1.amazonaws.com/123456789012/q"]
    {
        let text = format!(
            "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    interruptionQueue: {queue}\n"
        );
        let cfg = load(&text).unwrap_or_else(|e| panic!("{queue}: {e}"));
        assert_eq!(cfg.accounts[0].interruption_queue.as_deref(), Some(queue));
    }
    expect_error(
        "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1\n    interruptionQueue: 'my queue'\n",
        "accounts[0].interruptionQueue",
        "my queue",
    );
    expect_error(
        &sim(BASE_GROUP).replace("region: us-east-1\n", "region: us-east-1\n    interruptionQueue: q\n"),
        "accounts[0].interruptionQueue",
        "provider is simulated",
    );
}

#[test]
fn several_errors_are_all_reported() {
    let msg = load(&sim("
      - name: a
        instanceType: g6.xlarge
        zones: [us-east-1a]
        minSize: 3
        maxSize: 2
      - name: b
        instanceType: nope.large
        zones: [us-east-1a]
        maxSize: 2
"))
    .unwrap_err()
    .to_string();
    assert!(msg.contains("nodeGroups[0].minSize"), "{msg}");
    assert!(msg.contains("nodeGroups[1].instanceType"), "{msg}");
}

#[test]
fn load_files_names_unreadable_files() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "accounts:\n  - name: a\n    provider: aws\n    region: us-east-1").unwrap();
    let cfg = load_files(&[f.path()]).unwrap();
    assert_eq!(cfg.sources[0], f.path());
    let err = load_files(&["/nonexistent/gpuscale.yaml"]).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/gpuscale.yaml"), "{err}");
    assert!(matches!(load_files::<&str>(&[]), Err(ConfigError::NoFiles)));
}

/// Whether a pod accepts spot is read from Karpenter's `karpenter.sh/capacity-type` or gpuscale's
/// `gpuscale.io/capacity-type` selector, on every cloud: both labels are on every template, so the
/// plan puts an on-demand-only pod on the on-demand group even where the spot one is cheaper.
#[test]
fn pods_select_capacity_type_on_every_cloud() {
    use gpuscale::model::{CAPACITY_TYPE_LABEL, KARPENTER_CAPACITY_TYPE};
    let groups = "
      - name: od
        instanceType: g2-standard-4
        zones: [us-central1-a]
        maxSize: 4
        price: {onDemand: 1.0}
      - name: sp
        instanceType: g2-standard-4
        zones: [us-central1-a]
        capacityType: spot
        maxSize: 4
        price: {onDemand: 1.0, spot: 0.3}
";
    for provider in ["provider: gcp\n    project: p", "provider: simulated"] {
        let text = format!(
            "accounts:\n  - name: a\n    {provider}\n    region: us-central1\n    nodeGroups:{groups}"
        );
        let groups = load(&text).unwrap().node_groups();
        let (od, sp) = (&groups[0], &groups[1]);
        for key in [KARPENTER_CAPACITY_TYPE, CAPACITY_TYPE_LABEL] {
            assert_eq!(od.template.labels[key], "on-demand", "{provider}");
            assert_eq!(sp.template.labels[key], "spot", "{provider}");
            let mut pod = gpuscale::model::Workload { id: "ml/train".into(), ..Default::default() };
            pod.node_selector.insert(key.to_string(), "on-demand".to_string());
            assert!(pod.allowed_on(&od.template), "{provider} {key}");
            assert!(!pod.allowed_on(&sp.template), "{provider} {key}");
        }
    }
}
