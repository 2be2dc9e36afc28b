//! A bounded fuzz run per decoder, in `cargo test`: the snapshot reader (JSON fast path and the
//! general JSON/YAML path, then conversion), the provider config, the gpuscale config and the CEL
//! selector compiler and evaluator. Each starts from its seed corpus in
//! `tests/data/fuzz/<decoder>/` and mutates it (byte flips, truncation, insertion of bytes and of
//! tokens that exercise bounds, span repetition, splicing of two seeds) for a time budget: every
//! input must decode or be refused with an error; a panic fails the test with the input saved
//! (and printed), a stack overflow or abort leaves it in `<decoder>.current` under
//! `CARGO_TARGET_TMPDIR`. Each crash found becomes a case of `tests/hostile_input.rs` or of the
//! decoder's unit tests, its input a seed here.
//!
//! `GPUSCALE_FUZZ_SECONDS` sets the budget per decoder (default 2); `GPUSCALE_FUZZ_SEED` the
//! random seed (default: fixed, so CI runs are reproducible). The `fuzz/` crate runs the same
//! targets under libFuzzer for long runs (`cargo +nightly fuzz run <target>`).

use gpuscale::config::GpuscaleConfig;
use gpuscale::model::cel::{AttrValue, DeviceView, Program};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Tokens that hit bounds and parser corners.
const TOKENS: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    ",",
    ":",
    "\n",
    "- ",
    "&a ",
    "*a",
    "<<: ",
    "null",
    "~",
    "1e308",
    "-1",
    "0",
    "2147483647",
    "4294967296",
    "9223372036854775808",
    "1Ei",
    "0.000001m",
    "\\u0000",
    "\\ud800",
    "||",
    "&&",
    "!",
    "?",
    ".",
    "device",
    "matches(",
    "quantity(",
    "semver(",
    "\"items\":",
    "\"count\":",
    "\"kind\":\"List\"",
    "\"apiVersion\":\"v1\"",
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.5gb",
    "instanceSpec:",
    "gpus: ",
    "maxSize: ",
    "region: ",
    "price: {onDemand: ",
];

/// A small deterministic generator (xorshift64*), so a run is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut b = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(4) {
        let len = b.len().max(1);
        let at = rng.below(len).min(b.len());
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] = rng.next() as u8;
            }
            1 => b.truncate(at),
            2 => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(at..at, bytes);
            }
            3 => {
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                b.splice(at..at, t.iter().copied());
            }
            4 => {
                let end = (at + 1 + rng.below(64)).min(b.len());
                let span = b[at..end].to_vec();
                for _ in 0..1 + rng.below(16) {
                    b.splice(at..at, span.iter().copied());
                }
            }
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len());
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
            }
        }
    }
    b
}

fn corpus(decoder: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz").join(decoder);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

fn budget() -> Duration {
    let secs = std::env::var("GPUSCALE_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Runs `target` on the seeds, then on mutations of them for the budget; returns the inputs run.
fn fuzz(decoder: &str, extension: &str, target: impl Fn(&Path, &[u8])) -> usize {
    let seeds = corpus(decoder);
    let seed = std::env::var("GPUSCALE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9E37_79B9);
    let mut rng = Rng(seed | 1);
    let current = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{decoder}.current.{extension}"));
    let deadline = Instant::now() + budget();
    let mut runs = 0;
    let mut next = seeds.iter().cloned();
    loop {
        let input = match next.next() {
            Some(seed) => seed,
            None if Instant::now() < deadline => mutate(&mut rng, &seeds),
            None => break,
        };
        std::fs::write(&current, &input).unwrap();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| target(&current, &input)));
        if outcome.is_err() {
            let crash = current.with_file_name(format!("{decoder}.crash.{extension}"));
            std::fs::write(&crash, &input).unwrap();
            panic!(
                "{decoder}: a panic on {} bytes, saved in {}: {:?}",
                input.len(),
                crash.display(),
                String::from_utf8_lossy(&input)
            );
        }
        runs += 1;
    }
    println!("{decoder}: {runs} inputs in {:?}", budget());
    runs
}

#[test]
fn snapshot_decoder() {
    let runs = fuzz("snapshot", "json", |path, bytes| {
        // The file as `plan --snapshot` reads it (JSON fast path, general path, conversion).
        let _ = gpuscale::k8s::load_snapshot(path);
        // And as YAML, by its name.
        let yaml = path.with_extension("yaml");
        std::fs::write(&yaml, bytes).unwrap();
        let _ = gpuscale::k8s::load_snapshot(&yaml);
    });
    assert!(runs >= 4);
}

#[test]
fn provider_config_decoder() {
    let runs = fuzz("providers", "yaml", |path, bytes| {
        let text = String::from_utf8_lossy(bytes);
        if let Ok(config) = gpuscale::providers::config::load_strs(&[(path, text.as_ref())]) {
            // A config that loads builds its node groups.
            let _ = config.node_groups();
        }
    });
    assert!(runs >= 3);
}

#[test]
fn gpuscale_config_decoder() {
    let runs = fuzz("config", "yaml", |path, _| {
        let _ = GpuscaleConfig::load(path);
    });
    assert!(runs >= 2);
}

#[test]
fn cel_compiler_and_evaluator() {
    let d = "gpu.nvidia.com";
    let attributes = BTreeMap::from([
        (format!("{d}/type"), AttrValue::Str("gpu".into())),
        (format!("{d}/productName"), AttrValue::Str("NVIDIA H100 80GB HBM3".into())),
        (format!("{d}/index"), AttrValue::Int(3)),
        (format!("{d}/mig"), AttrValue::Bool(false)),
        (
            format!("{d}/driverVersion"),
            AttrValue::Version(gpuscale::model::cel::Semver::parse("550.90.7").unwrap()),
        ),
    ]);
    let capacity = BTreeMap::from([(format!("{d}/memory"), 81_559i128 << 20)]);
    let device = DeviceView { driver: d, attributes: &attributes, capacity: &capacity };
    let runs = fuzz("cel", "cel", |_, bytes| {
        if let Ok(p) = Program::compile(&String::from_utf8_lossy(bytes)) {
            let _ = p.matches(&device);
        }
    });
    assert!(runs >= 8);
}
