//! GPU models: memory, MIG geometry and interconnect, keyed by a canonical name.
//!
//! Clusters name the same GPU many ways (GFD's `NVIDIA-A100-SXM4-40GB`, a trace's `V100M32`,
//! a cloud's `nvidia-tesla-a100`), so [`GpuCatalog::resolve`] maps all of them to one entry.

use super::mig::{self, MigGeometry};
use serde::Serialize;

/// What the scheduler needs to know about a GPU model.
#[derive(Debug, Clone, Serialize)]
pub struct GpuModelSpec {
    /// Canonical name, e.g. `A100-40GB`.
    pub name: &'static str,
    /// Other names the model goes by (trace names, cloud accelerator names).
    pub aliases: &'static [&'static str],
    /// Device memory in MiB (0 where unknown).
    pub memory_mib: u64,
    /// MIG geometry, for MIG-capable models.
    #[serde(skip)]
    pub mig: Option<&'static MigGeometry>,
    /// Whether multi-GPU servers of this model usually connect GPUs with NVLink/NVSwitch.
    pub nvlink: bool,
}

const fn spec(
    name: &'static str,
    aliases: &'static [&'static str],
    memory_gib: u64,
    mig: Option<&'static MigGeometry>,
    nvlink: bool,
) -> GpuModelSpec {
    GpuModelSpec { name, aliases, memory_mib: memory_gib * 1024, mig, nvlink }
}

static MODELS: &[GpuModelSpec] = &[
    spec("H200-141GB", &["H200", "NVIDIA-H200"], 141, Some(&mig::H200_141GB), true),
    spec("H100-94GB", &["H100-NVL", "NVIDIA-H100-NVL"], 94, Some(&mig::H100_94GB), true),
    spec(
        "H100-80GB",
        &["H100", "NVIDIA-H100-80GB-HBM3", "nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
        80,
        Some(&mig::H100_80GB),
        true,
    ),
    spec(
        "A100-80GB",
        &["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "nvidia-a100-80gb"],
        80,
        Some(&mig::A100_80GB),
        true,
    ),
    spec(
        "A100-40GB",
        &["A100", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "nvidia-tesla-a100"],
        40,
        Some(&mig::A100_40GB),
        true,
    ),
    spec("A30-24GB", &["A30", "NVIDIA-A30"], 24, Some(&mig::A30_24GB), false),
    spec("L40S", &["NVIDIA-L40S"], 48, None, false),
    spec("L40", &["NVIDIA-L40"], 48, None, false),
    spec("L4", &["NVIDIA-L4", "nvidia-l4"], 24, None, false),
    spec("A10G", &["NVIDIA-A10G"], 24, None, false),
    spec("A10", &["NVIDIA-A10"], 24, None, false),
    spec("T4", &["Tesla-T4", "nvidia-tesla-t4"], 16, None, false),
    spec("V100-32GB", &["V100M32", "Tesla-V100-SXM2-32GB"], 32, None, true),
    spec("V100-16GB", &["V100M16", "V100", "Tesla-V100-SXM2-16GB", "nvidia-tesla-v100"], 16, None, true),
    spec("P100", &["Tesla-P100-PCIE-16GB", "nvidia-tesla-p100"], 16, None, false),
    spec("K80", &["Tesla-K80", "nvidia-tesla-k80"], 12, None, false),
    // Alibaba-internal model names from the openb trace; their memory is not published.
    spec("G2", &[], 0, None, false),
    spec("G3", &[], 0, None, false),
];

/// The set of GPU models a cluster may have.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuCatalog;

impl GpuCatalog {
    /// Every known model.
    pub fn models(&self) -> &'static [GpuModelSpec] {
        MODELS
    }

    /// Finds a model by canonical name, alias, GFD product label (with or without a `-MIG-…`
    /// suffix) or cloud accelerator name, ignoring case.
    pub fn resolve(&self, name: &str) -> Option<&'static GpuModelSpec> {
        // Fast path: canonical names, which is what nodes carry after ingestion.
        if let Some(found) = MODELS.iter().find(|m| m.name == name) {
            return Some(found);
        }
        let trimmed = name.trim();
        let base = trimmed.split("-MIG-").next().unwrap_or(trimmed);
        if let Some(found) = MODELS.iter().find(|m| {
            m.name.eq_ignore_ascii_case(base) || m.aliases.iter().any(|a| a.eq_ignore_ascii_case(base))
        }) {
            return Some(found);
        }
        // A vGPU is a slice of a physical GPU with its own memory and no MIG: matching its
        // name by substring would plan `GRID-A100-4C` as a whole 40 GB A100.
        if vgpu_profile(base).is_some() {
            return None;
        }
        let up = base.to_ascii_uppercase();
        let has = |s: &str| up.contains(s);
        let canonical = if has("H200") {
            "H200-141GB"
        } else if has("H100") && (has("94") || has("NVL")) {
            "H100-94GB"
        } else if has("H100") {
            "H100-80GB"
        } else if has("A100") && has("80G") {
            "A100-80GB"
        } else if has("A100") {
            "A100-40GB"
        } else if has("A30") {
            "A30-24GB"
        } else if has("L40S") {
            "L40S"
        } else if has("L40") {
            "L40"
        } else if has("A10G") {
            "A10G"
        } else if has("A10") {
            "A10"
        } else if has("L4") {
            "L4"
        } else if has("T4") {
            "T4"
        } else if has("V100") && has("32") {
            "V100-32GB"
        } else if has("V100") {
            "V100-16GB"
        } else if has("P100") {
            "P100"
        } else {
            return None;
        };
        MODELS.iter().find(|m| m.name == canonical)
    }
}

/// The frame buffer in GiB of an NVIDIA vGPU profile name (`GRID-A100-4C`, `NVIDIA A100-7-40C`,
/// `GRID T4-16Q`, `NVIDIA-L4-24Q`): GRID-prefixed, or ending in `-<GiB><series>` with series A,
/// B, C or Q. `None` for physical GPU names.
pub fn vgpu_profile(name: &str) -> Option<u64> {
    let name = name.trim();
    let last = name.rsplit(['-', ' ']).next()?;
    // Labels are user text: split and compare on character boundaries, never mid-character.
    let (digits, series) = last.split_at(last.char_indices().last().map_or(0, |(i, _)| i));
    let fb = digits.parse::<u64>().ok().filter(|_| matches!(series, "A" | "B" | "C" | "Q"));
    let grid = name.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GRID"));
    match (fb, grid) {
        (Some(gib), _) => Some(gib),
        (None, true) => Some(0),
        (None, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_characters_of_several_bytes_are_judged_not_split() {
        // Found by tests/fuzz_snapshot.rs: slicing by bytes panicked inside '۶' (2 bytes).
        for (name, fb) in [
            ("GR۶D-T4-16Q", Some(16)),
            ("GR۶D", None),
            ("A100-40۶", None),
            ("۶", None),
            ("T4-16Q۶", None),
            ("ü", None),
        ] {
            assert_eq!(vgpu_profile(name), fb, "{name}");
        }
        // Still a physical A100 by its model's name, as the label's other characters allow.
        assert_eq!(vgpu_profile("NVI۶DIA-A100-SXM4-40GB"), None);
        assert_eq!(GpuCatalog.resolve("NVI۶DIA-A100-SXM4-40GB").map(|m| m.name), Some("A100-40GB"));
        assert_eq!(vgpu_profile("GRID۶-A100-4C"), Some(4), "a profile whatever precedes it");
    }

    #[test]
    fn vgpu_profiles_are_not_physical_gpus() {
        for (name, fb) in [
            ("GRID-A100-4C", 4),
            ("GRID A100-4C", 4),
            ("NVIDIA A100-7-40C", 40),
            ("GRID-T4-16Q", 16),
            ("NVIDIA-L4-24Q", 24),
            ("NVIDIA H100-80C", 80),
            ("GRID-V100DX-32Q", 32),
        ] {
            assert_eq!(vgpu_profile(name), Some(fb), "{name}");
            assert!(GpuCatalog.resolve(name).is_none(), "{name} resolved to a physical GPU");
        }
        for physical in
            ["NVIDIA-A100-SXM4-40GB", "NVIDIA-L4", "Tesla-T4", "NVIDIA-H100-NVL", "A10", "G2", "V100M32"]
        {
            assert_eq!(vgpu_profile(physical), None, "{physical}");
            assert!(GpuCatalog.resolve(physical).is_some(), "{physical}");
        }
    }

    #[test]
    fn resolves_the_names_clusters_use() {
        let c = GpuCatalog;
        let cases = [
            ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
            ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
            ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
            ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
            ("NVIDIA-H100-NVL", "H100-94GB"),
            ("NVIDIA-H200", "H200-141GB"),
            ("NVIDIA-A10G", "A10G"),
            ("NVIDIA-L4", "L4"),
            ("Tesla-T4", "T4"),
            ("V100M32", "V100-32GB"),
            ("v100m16", "V100-16GB"),
            ("nvidia-tesla-a100", "A100-40GB"),
            ("G2", "G2"),
        ];
        for (name, want) in cases {
            assert_eq!(c.resolve(name).map(|m| m.name), Some(want), "{name}");
        }
        assert!(c.resolve("Radeon-MI300X").is_none());
    }

    #[test]
    fn mig_capable_models_carry_their_geometry() {
        let c = GpuCatalog;
        assert!(c.resolve("H100-80GB").unwrap().mig.unwrap().profile("3g.40gb").is_some());
        assert!(c.resolve("A100-40GB").unwrap().mig.unwrap().profile("3g.20gb").is_some());
        assert!(c.resolve("H200").unwrap().mig.unwrap().profile("1g.18gb").is_some());
        assert!(c.resolve("T4").unwrap().mig.is_none());
    }
}
