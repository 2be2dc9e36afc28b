//! The container image is defined twice, by `scripts/build-image.sh` (built and run by
//! `scripts/test-image.sh`) and by the `Dockerfile` (built by the release workflow, which cannot
//! run here); these tests check that both say the same, and that the image's tag, the crate's
//! version and the Helm chart's appVersion and repository agree.

#[path = "support/image_config.rs"]
mod image_config;

use image_config::{print_config, ImageConfig};
use std::path::Path;

fn read(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// One Dockerfile instruction: keyword and arguments, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (keyword, args) = current.split_once(char::is_whitespace).unwrap_or((&current, ""));
        out.push(Instruction { keyword: keyword.to_uppercase(), args: args.trim().to_string() });
        current.clear();
    }
    out
}

/// The stages of the Dockerfile, each from its FROM.
fn stages(text: &str) -> Vec<Vec<Instruction>> {
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for i in instructions(text) {
        if i.keyword == "FROM" {
            stages.push(Vec::new());
        }
        if let Some(s) = stages.last_mut() {
            s.push(i);
        }
    }
    stages
}

fn args_of<'a>(stage: &'a [Instruction], keyword: &str) -> Vec<&'a str> {
    stage.iter().filter(|i| i.keyword == keyword).map(|i| i.args.as_str()).collect()
}

/// `KEY=value` or `KEY="value"` of an ENV, LABEL or ARG instruction (one pair per instruction).
fn pair(args: &str) -> (String, String) {
    let (k, v) = args.split_once('=').unwrap_or_else(|| panic!("not KEY=value: {args}"));
    (k.to_string(), v.trim_matches('"').to_string())
}

#[test]
fn dockerfile_builds_what_build_image_builds() {
    let c: ImageConfig = print_config();
    let dockerfile = read("Dockerfile");
    let stages = stages(&dockerfile);
    assert_eq!(stages.len(), 2, "a build stage and the image: {stages:?}");
    let (build, image) = (&stages[0], &stages[1]);

    // The build stage: Debian bookworm (where image-rootfs.sh's packages come from), the release
    // binary with the image's features, and the same root file system script.
    assert!(build[0].args.contains("-bookworm AS build"), "build stage base: {}", build[0].args);
    let runs = args_of(build, "RUN").join("\n");
    let cargo =
        format!("cargo build --profile {} --locked --features {} --bin gpuscale", c.profile, c.features);
    assert!(runs.contains(&cargo), "the Dockerfile must run `{cargo}`:\n{runs}");
    assert!(
        runs.contains(&format!("scripts/image-rootfs.sh target/{}/gpuscale /rootfs", c.profile)),
        "the Dockerfile must assemble the root file system with scripts/image-rootfs.sh:\n{runs}"
    );

    // The image: that root file system alone, with the same config.
    assert_eq!(image[0].args, "scratch", "the image starts from scratch");
    assert_eq!(args_of(image, "COPY"), ["--from=build /rootfs/ /"]);
    assert_eq!(args_of(image, "USER"), [c.user.as_str()]);
    assert_eq!(args_of(image, "WORKDIR"), [c.workdir.as_str()]);
    assert_eq!(args_of(image, "ENTRYPOINT"), [format!("[\"{}\"]", c.entrypoint).as_str()]);
    assert!(args_of(image, "CMD").is_empty(), "no CMD: the chart passes the subcommand as args");
    let env: Vec<String> = args_of(image, "ENV").into_iter().map(|a| a.replace('"', "")).collect();
    assert_eq!(env, c.env, "ENV");

    // Labels: the same keys; the same values except those the workflow passes as build arguments.
    let args: Vec<(String, String)> = args_of(image, "ARG").into_iter().map(pair).collect();
    let labels: Vec<(String, String)> = args_of(image, "LABEL").into_iter().map(pair).collect();
    let mut keys: Vec<&String> = labels.iter().map(|(k, _)| k).collect();
    keys.sort();
    assert_eq!(keys, c.labels.keys().collect::<Vec<_>>(), "LABEL keys");
    for (key, value) in &labels {
        match value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
            Some(arg) => {
                assert!(args.iter().any(|(a, _)| a == arg), "{key} uses ${{{arg}}}, which is no ARG")
            }
            None => assert_eq!(Some(value), c.labels.get(key), "LABEL {key}"),
        }
    }
    let version_arg = args.iter().find(|(a, _)| a == "VERSION").map(|(_, v)| v.as_str());
    assert_eq!(version_arg, Some(c.tag.as_str()), "ARG VERSION's default is the crate's version");
}

#[test]
fn image_tag_crate_version_and_chart_agree() {
    let c = print_config();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(c.tag, version, "the image tag is the crate's version");
    assert_eq!(c.labels.get("org.opencontainers.image.version").map(String::as_str), Some(version));

    let chart: serde_yaml::Value = serde_yaml::from_str(&read("charts/gpuscale/Chart.yaml")).unwrap();
    assert_eq!(chart["appVersion"].as_str(), Some(version), "Chart.yaml appVersion is the crate's version");
    let values: serde_yaml::Value = serde_yaml::from_str(&read("charts/gpuscale/values.yaml")).unwrap();
    assert_eq!(
        values["image"]["repository"].as_str(),
        Some(c.repository.as_str()),
        "values.yaml image.repository"
    );
    assert_eq!(values["image"]["tag"].as_str(), Some(""), "values.yaml image.tag: empty means appVersion");
    assert_eq!(values["agent"]["image"]["repository"].as_str(), Some(""), "the agent uses the same image");
    assert_eq!(values["agent"]["image"]["tag"].as_str(), Some(""), "the agent uses the same tag");

    // The release workflow pushes ghcr.io/<the GitHub repository>: the source label's.
    let source = &c.labels["org.opencontainers.image.source"];
    let github = source.strip_prefix("https://github.com/").expect("a GitHub source label");
    assert_eq!(c.repository, format!("ghcr.io/{github}"), "the image name is the GitHub repository's");
    assert_eq!(source, env!("CARGO_PKG_REPOSITORY"));
}

/// The steps of a workflow job that use an action (`uses: owner/name@version`), by action name.
fn step<'a>(job: &'a serde_yaml::Value, action: &str) -> &'a serde_yaml::Value {
    let steps = job["steps"].as_sequence().expect("steps");
    let found: Vec<&serde_yaml::Value> = steps
        .iter()
        .filter(|s| s["uses"].as_str().and_then(|u| u.split_once('@')).is_some_and(|(a, _)| a == action))
        .collect();
    assert_eq!(found.len(), 1, "one {action} step: {steps:?}");
    found[0]
}

/// The release workflow builds the Dockerfile for amd64 and arm64, each natively, with the build
/// arguments the Dockerfile declares and provenance, and tags the joined image with the version.
#[test]
fn release_workflow_builds_the_dockerfile_for_both_platforms() {
    let w: serde_yaml::Value = serde_yaml::from_str(&read(".github/workflows/image.yml")).unwrap();
    assert_eq!(w["on"]["push"]["tags"], serde_yaml::from_str::<serde_yaml::Value>("[v*]").unwrap());
    assert_eq!(w["env"]["IMAGE"].as_str(), Some("ghcr.io/${{ github.repository }}"));

    let build = &w["jobs"]["build"];
    let mut platforms: Vec<(&str, &str)> = build["strategy"]["matrix"]["include"]
        .as_sequence()
        .expect("a matrix of platforms and runners")
        .iter()
        .map(|m| (m["platform"].as_str().unwrap(), m["runner"].as_str().unwrap()))
        .collect();
    platforms.sort();
    assert_eq!(platforms.iter().map(|p| p.0).collect::<Vec<_>>(), ["linux/amd64", "linux/arm64"]);
    assert!(platforms[1].1.ends_with("-arm"), "arm64 builds on an arm64 runner, not emulated: {platforms:?}");
    assert_eq!(build["runs-on"].as_str(), Some("${{ matrix.runner }}"));
    assert_eq!(build["permissions"]["packages"].as_str(), Some("write"));

    let push = &step(build, "docker/build-push-action")["with"];
    assert_eq!(push["platforms"].as_str(), Some("${{ matrix.platform }}"));
    assert_eq!(push["provenance"].as_str(), Some("mode=max"), "a SLSA provenance attestation");
    let outputs = push["outputs"].as_str().expect("outputs");
    for part in ["type=image", "name=${{ env.IMAGE }}", "push-by-digest=true", "push=true"] {
        assert!(outputs.split(',').any(|o| o == part), "outputs lacks {part}: {outputs}");
    }
    // Every build argument is one the Dockerfile declares (a misspelt one would be ignored).
    let declared: Vec<String> = instructions(&read("Dockerfile"))
        .into_iter()
        .filter(|i| i.keyword == "ARG")
        .map(|i| i.args.split('=').next().unwrap().to_string())
        .collect();
    let passed: Vec<&str> = push["build-args"]
        .as_str()
        .expect("build-args")
        .lines()
        .map(|l| l.split('=').next().unwrap().trim())
        .collect();
    assert_eq!(passed, ["SOURCE_DATE_EPOCH", "VERSION", "REVISION", "CREATED"]);
    for arg in &passed {
        assert!(
            declared.iter().any(|d| d == arg),
            "build-arg {arg} is no ARG of the Dockerfile: {declared:?}"
        );
    }

    // The merge job tags the multi-platform image with the version (the chart's appVersion).
    let merge = &w["jobs"]["merge"];
    assert_eq!(merge["needs"].as_str(), Some("build"));
    let meta = &step(merge, "docker/metadata-action")["with"];
    assert_eq!(meta["images"].as_str(), Some("${{ env.IMAGE }}"));
    let tags = meta["tags"].as_str().expect("tags");
    assert!(tags.lines().any(|t| t.trim() == "type=semver,pattern={{version}}"), "{tags}");
}
