//! The benches' real-shaped clusters, made once per size by `gpuscale generate`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `<target tmp>/<name>-<nodes>/` holding `cluster.json` (and the generator's configuration) of
/// `nodes` GPU nodes with `running` and `pending` pods; generated on first use.
pub fn generated(name: &str, nodes: usize, running: usize, pending: usize) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{nodes}"));
    if !dir.join("cluster.json").exists() {
        let status = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
            .args(["generate", "--nodes", &nodes.to_string(), "--running", &running.to_string()])
            .args(["--pending", &pending.to_string(), "--out"])
            .arg(&dir)
            .status()
            .expect("run gpuscale generate");
        assert!(status.success(), "gpuscale generate failed");
    }
    dir
}
