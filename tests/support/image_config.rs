//! The container image's definition as `scripts/build-image.sh --print-config` states it.

#![allow(dead_code)] // each test uses some of the fields

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// What the image is: its name and config.
#[derive(Debug, Default)]
pub struct ImageConfig {
    pub repository: String,
    pub tag: String,
    pub features: String,
    pub profile: String,
    pub user: String,
    pub workdir: String,
    pub entrypoint: String,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// Runs `scripts/build-image.sh --print-config` (needs bash and git, not umoci) and parses it.
pub fn print_config() -> ImageConfig {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/build-image.sh"))
        .arg("--print-config")
        .output()
        .expect("running scripts/build-image.sh");
    assert!(out.status.success(), "build-image.sh --print-config: {}", String::from_utf8_lossy(&out.stderr));
    let mut c = ImageConfig::default();
    for line in String::from_utf8(out.stdout).expect("UTF-8").lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        let value = value.to_string();
        match key {
            "repository" => c.repository = value,
            "tag" => c.tag = value,
            "features" => c.features = value,
            "profile" => c.profile = value,
            "user" => c.user = value,
            "workdir" => c.workdir = value,
            "entrypoint" => c.entrypoint = value,
            "env" => c.env.push(value),
            "label" => {
                let (k, v) = value.split_once('=').expect("label key=value");
                c.labels.insert(k.to_string(), v.to_string());
            }
            _ => {}
        }
    }
    assert!(!c.repository.is_empty() && !c.tag.is_empty() && !c.entrypoint.is_empty(), "{c:?}");
    c
}
