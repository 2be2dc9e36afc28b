//! MIG (Multi-Instance GPU) geometry: which GPU instance profiles exist on each GPU model and where
//! on the GPU they may be placed.
//!
//! NVIDIA places GPU instances on memory slices; each profile may start only at documented slice
//! offsets (`nvidia-smi mig -lgipp`), instances may not overlap, and the compute slices of all
//! instances may not exceed the GPU's. Treating MIG as "N slices of a pool" (what most
//! autoscalers do) admits layouts the driver refuses, e.g. a `4g.20gb` beside a `3g.20gb` at
//! offset 0, so placements here follow the real start offsets.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A MIG GPU instance profile of one GPU model, e.g. `3g.20gb` on an A100-40GB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigProfile {
    /// Profile name as used in `nvidia.com/mig-<name>` resources, e.g. `1g.5gb`.
    pub name: &'static str,
    /// Compute (SM) slices the instance takes.
    pub compute_slices: u8,
    /// Memory slices the instance takes; also its width in placement slots.
    pub memory_slices: u8,
    /// Memory-slice offsets at which the instance may start.
    pub starts: &'static [u8],
    /// Profiles with media extensions (`+me`): at most one per GPU.
    pub media_extensions: bool,
}

/// The MIG geometry of a GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigGeometry {
    /// Memory slices (placement slots) on the GPU.
    pub memory_slices: u8,
    /// Compute slices on the GPU.
    pub compute_slices: u8,
    /// Profiles the GPU supports, smallest first.
    pub profiles: &'static [MigProfile],
}

/// One MIG GPU instance placed on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct MigPlacement {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the instance.
    pub start: u8,
}

/// Why a MIG layout is not valid on a GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MigError {
    /// The profile does not exist on this GPU model.
    #[error("MIG profile {profile:?} does not exist on this GPU model")]
    UnknownProfile {
        /// The profile name.
        profile: String,
    },
    /// The profile may not start at this memory slice.
    #[error("MIG profile {profile} cannot start at memory slice {start} (allowed: {allowed:?})")]
    InvalidStart {
        /// The profile name.
        profile: String,
        /// The requested start.
        start: u8,
        /// Valid starts.
        allowed: Vec<u8>,
    },
    /// Two instances share memory slices.
    #[error("MIG instances {first} and {second} overlap")]
    Overlap {
        /// The first instance, `profile@start`.
        first: String,
        /// The second instance.
        second: String,
    },
    /// The instances need more compute slices than the GPU has.
    #[error("MIG layout needs {needed} compute slices, the GPU has {available}")]
    ComputeExceeded {
        /// Compute slices asked for.
        needed: u8,
        /// Compute slices on the GPU.
        available: u8,
    },
    /// More than one media-extension instance.
    #[error("at most one MIG instance with media extensions (+me) fits on a GPU")]
    MediaExtensionsExceeded,
}

macro_rules! profile {
    ($name:literal, $c:literal, $m:literal, [$($s:literal),*]) => {
        MigProfile { name: $name, compute_slices: $c, memory_slices: $m, starts: &[$($s),*], media_extensions: false }
    };
    ($name:literal, $c:literal, $m:literal, [$($s:literal),*], me) => {
        MigProfile { name: $name, compute_slices: $c, memory_slices: $m, starts: &[$($s),*], media_extensions: true }
    };
}

/// The 8-slot geometry shared by A100, H100 and H200, with that model's memory sizes in the names.
macro_rules! eight_slot_geometry {
    ($one:literal, $one_me:literal, $one_double:literal, $two:literal, $three:literal, $four:literal, $seven:literal) => {
        MigGeometry {
            memory_slices: 8,
            compute_slices: 7,
            profiles: &[
                profile!($one, 1, 1, [0, 1, 2, 3, 4, 5, 6]),
                profile!($one_me, 1, 1, [0, 1, 2, 3, 4, 5, 6], me),
                profile!($one_double, 1, 2, [0, 2, 4, 6]),
                profile!($two, 2, 2, [0, 2, 4]),
                profile!($three, 3, 4, [0, 4]),
                profile!($four, 4, 4, [0]),
                profile!($seven, 7, 8, [0]),
            ],
        }
    };
}

/// Whole-GPU milli of a MIG profile: its memory slices of the GPU's when `geometry` knows it,
/// else from its name (`3g.20gb` is 3 of 7 compute slices).
pub fn profile_milli(profile: &str, geometry: Option<&MigGeometry>) -> u64 {
    if let Some(p) = geometry.and_then(|g| g.profile(profile)) {
        return u64::from(p.memory_slices) * 1000 / u64::from(geometry.map_or(1, |g| g.memory_slices).max(1));
    }
    let slices = profile.split('g').next().and_then(|s| s.parse::<u64>().ok()).unwrap_or(7);
    (slices.min(7) * 1000) / 7
}

/// Every profile name of the geometries above, each once.
pub fn all_profiles() -> impl Iterator<Item = &'static str> {
    let all = [&A100_40GB, &A100_80GB, &H100_80GB, &H100_94GB, &H200_141GB, &A30_24GB];
    let mut seen = std::collections::BTreeSet::new();
    all.into_iter().flat_map(|g| g.profiles.iter().map(|p| p.name)).filter(move |n| seen.insert(*n))
}

/// A100-SXM4/PCIE-40GB.
pub static A100_40GB: MigGeometry =
    eight_slot_geometry!("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb");
/// A100-SXM4/PCIE-80GB.
pub static A100_80GB: MigGeometry =
    eight_slot_geometry!("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb");
/// H100-SXM5/PCIE-80GB.
pub static H100_80GB: MigGeometry =
    eight_slot_geometry!("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb");
/// H100-NVL-94GB.
pub static H100_94GB: MigGeometry =
    eight_slot_geometry!("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb");
/// H200-141GB.
pub static H200_141GB: MigGeometry =
    eight_slot_geometry!("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb");
/// A30-24GB: four memory slices and four compute slices.
pub static A30_24GB: MigGeometry = MigGeometry {
    memory_slices: 4,
    compute_slices: 4,
    profiles: &[
        profile!("1g.6gb", 1, 1, [0, 1, 2, 3]),
        profile!("1g.6gb+me", 1, 1, [0, 1, 2, 3], me),
        profile!("2g.12gb", 2, 2, [0, 2]),
        profile!("2g.12gb+me", 2, 2, [0, 2], me),
        profile!("4g.24gb", 4, 4, [0]),
    ],
};

/// The slots, compute slices and media extensions a GPU's instances take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayoutState {
    occupied: u16,
    compute: u8,
    media: bool,
}

impl LayoutState {
    /// The state with one more instance of `profile` at `start`.
    pub fn with(self, profile: &MigProfile, start: u8) -> Self {
        Self {
            occupied: self.occupied | MigGeometry::mask(profile, start),
            compute: self.compute + profile.compute_slices,
            media: self.media || profile.media_extensions,
        }
    }
}

impl MigGeometry {
    /// Looks a profile up by name.
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Bitmask of the memory slices an instance occupies.
    pub fn mask(profile: &MigProfile, start: u8) -> u16 {
        (((1u32 << profile.memory_slices) - 1) << start) as u16
    }

    /// Checks a whole layout against the placement rules of this GPU model.
    pub fn validate(&self, layout: &[MigPlacement]) -> Result<(), MigError> {
        let mut used: Vec<(u16, &MigPlacement)> = Vec::with_capacity(layout.len());
        let mut compute = 0u8;
        let mut media = 0;
        for inst in layout {
            let profile = self
                .profile(&inst.profile)
                .ok_or_else(|| MigError::UnknownProfile { profile: inst.profile.clone() })?;
            if !profile.starts.contains(&inst.start) {
                return Err(MigError::InvalidStart {
                    profile: inst.profile.clone(),
                    start: inst.start,
                    allowed: profile.starts.to_vec(),
                });
            }
            let mask = Self::mask(profile, inst.start);
            if let Some((_, other)) = used.iter().find(|(m, _)| m & mask != 0) {
                return Err(MigError::Overlap {
                    first: format!("{}@{}", other.profile, other.start),
                    second: format!("{}@{}", inst.profile, inst.start),
                });
            }
            used.push((mask, inst));
            compute += profile.compute_slices;
            media += usize::from(profile.media_extensions);
        }
        if compute > self.compute_slices {
            return Err(MigError::ComputeExceeded { needed: compute, available: self.compute_slices });
        }
        if media > 1 {
            return Err(MigError::MediaExtensionsExceeded);
        }
        Ok(())
    }

    /// Where a new instance of `profile` should go on a GPU whose instances are `layout`, or `None`
    /// when it fits nowhere. Among the valid starts it keeps the most room for later instances: the
    /// start after which the largest number of slots remains placeable for the biggest profiles.
    pub fn best_start(&self, layout: &[MigPlacement], profile: &MigProfile) -> Option<u8> {
        self.best_start_in(self.layout_state(layout)?, profile)
    }

    /// [`MigGeometry::best_start`] on a layout's [`LayoutState`].
    pub fn best_start_in(&self, layout: LayoutState, profile: &MigProfile) -> Option<u8> {
        if layout.compute + profile.compute_slices > self.compute_slices {
            return None;
        }
        if profile.media_extensions && layout.media {
            return None;
        }
        profile
            .starts
            .iter()
            .copied()
            .filter(|&s| Self::mask(profile, s) & layout.occupied == 0)
            .max_by_key(|&s| (self.room_left(layout.occupied | Self::mask(profile, s)), s))
    }

    /// What placing more instances on a GPU depends on; `None` when the layout names unknown
    /// profiles.
    pub fn layout_state<'a>(
        &self,
        layout: impl IntoIterator<Item = &'a MigPlacement>,
    ) -> Option<LayoutState> {
        let mut state = LayoutState::default();
        for inst in layout {
            state = state.with(self.profile(&inst.profile)?, inst.start);
        }
        Some(state)
    }

    /// Occupied slot mask and compute slices used by a layout; `None` when it names unknown profiles.
    pub fn occupancy(&self, layout: &[MigPlacement]) -> Option<(u16, u8)> {
        self.layout_state(layout).map(|s| (s.occupied, s.compute))
    }

    /// A measure of what can still be placed in the free slots: for each profile, the memory
    /// slices of its still-valid placements, so large contiguous regions count most.
    fn room_left(&self, occupied: u16) -> u32 {
        self.profiles
            .iter()
            .filter(|p| !p.media_extensions)
            .map(|p| {
                let fits = p.starts.iter().any(|&s| Self::mask(p, s) & occupied == 0);
                if fits {
                    u32::from(p.memory_slices) * u32::from(p.memory_slices)
                } else {
                    0
                }
            })
            .sum()
    }

    /// Every maximal valid layout (no further instance fits) made of non-media profiles, as
    /// sorted placement lists. Used to propose MIG re-partitioning.
    pub fn maximal_layouts(&self) -> Vec<Vec<MigPlacement>> {
        let mut out = Vec::new();
        let mut current = Vec::new();
        self.extend_layouts(0, &mut current, &mut out);
        out.sort();
        out.dedup();
        out
    }

    fn extend_layouts(&self, from: usize, current: &mut Vec<MigPlacement>, out: &mut Vec<Vec<MigPlacement>>) {
        let (occupied, compute) = self.occupancy(current).unwrap_or((0, 0));
        let mut extended = false;
        for (pi, p) in self.profiles.iter().enumerate().filter(|(_, p)| !p.media_extensions) {
            for &s in p.starts {
                let key = pi * 16 + s as usize;
                let fits =
                    Self::mask(p, s) & occupied == 0 && compute + p.compute_slices <= self.compute_slices;
                if !fits {
                    continue;
                }
                extended = true;
                if key < from {
                    continue;
                }
                current.push(MigPlacement { profile: p.name.to_string(), start: s });
                self.extend_layouts(key, current, out);
                current.pop();
            }
        }
        if !extended {
            let mut layout = current.clone();
            layout.sort_by_key(|i| i.start);
            out.push(layout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(profile: &str, start: u8) -> MigPlacement {
        MigPlacement { profile: profile.into(), start }
    }

    #[test]
    fn a100_40gb_documented_layouts_are_valid() {
        // Layouts from NVIDIA's MIG user guide, "A100 supported profiles" figure.
        let valid = [
            vec![p("7g.40gb", 0)],
            vec![p("4g.20gb", 0), p("3g.20gb", 4)],
            vec![p("4g.20gb", 0), p("2g.10gb", 4), p("1g.5gb", 6)],
            vec![p("3g.20gb", 0), p("3g.20gb", 4)],
            vec![p("2g.10gb", 0), p("2g.10gb", 2), p("2g.10gb", 4), p("1g.5gb", 6)],
            (0..7).map(|s| p("1g.5gb", s)).collect(),
            vec![p("1g.10gb", 0), p("1g.10gb", 2), p("1g.10gb", 4), p("1g.10gb", 6)],
            vec![p("3g.20gb", 4), p("2g.10gb", 0), p("1g.5gb", 2), p("1g.5gb", 3)],
        ];
        for layout in valid {
            assert_eq!(A100_40GB.validate(&layout), Ok(()), "{layout:?}");
        }
    }

    #[test]
    fn a100_40gb_rejects_invalid_layouts() {
        assert!(matches!(
            A100_40GB.validate(&[p("3g.20gb", 2)]),
            Err(MigError::InvalidStart { start: 2, .. })
        ));
        assert!(matches!(A100_40GB.validate(&[p("4g.20gb", 4)]), Err(MigError::InvalidStart { .. })));
        assert!(matches!(
            A100_40GB.validate(&[p("4g.20gb", 0), p("3g.20gb", 0)]),
            Err(MigError::Overlap { .. })
        ));
        // 1g.5gb may not use the eighth memory slice.
        assert!(matches!(A100_40GB.validate(&[p("1g.5gb", 7)]), Err(MigError::InvalidStart { .. })));
        assert!(matches!(
            A100_40GB.validate(&[p("1g.5gb+me", 0), p("1g.5gb+me", 1)]),
            Err(MigError::MediaExtensionsExceeded)
        ));
        assert!(matches!(
            A100_40GB.validate(&[p("1g.10gb", 0)]).and(A100_80GB.validate(&[p("1g.5gb", 0)])),
            Err(MigError::UnknownProfile { .. })
        ));
    }

    #[test]
    fn compute_slices_are_limited_to_seven() {
        // Eight memory slices but seven compute slices: 2g+2g+2g+1g.10gb is 7 compute, valid;
        // the memory is then full too.
        assert_eq!(
            H100_80GB.validate(&[p("2g.20gb", 0), p("2g.20gb", 2), p("2g.20gb", 4), p("1g.20gb", 6)]),
            Ok(())
        );
        assert_eq!(A100_40GB.compute_slices, 7);
    }

    #[test]
    fn best_start_keeps_room_for_large_profiles() {
        // A 1g instance goes to the top, leaving slots 0-3 for a 4g or 3g.
        let start = A100_40GB.best_start(&[], A100_40GB.profile("1g.5gb").unwrap()).unwrap();
        assert!(start >= 4, "1g placed at {start}");
        let layout = vec![p("1g.5gb", start)];
        assert!(A100_40GB.best_start(&layout, A100_40GB.profile("4g.20gb").unwrap()).is_some());
        // A full GPU takes nothing more.
        assert_eq!(A100_40GB.best_start(&[p("7g.40gb", 0)], A100_40GB.profile("1g.5gb").unwrap()), None);
        // 3g.20gb next to a 4g must start at 4.
        assert_eq!(A100_40GB.best_start(&[p("4g.20gb", 0)], A100_40GB.profile("3g.20gb").unwrap()), Some(4));
    }

    #[test]
    fn a30_has_four_slices() {
        assert_eq!(A30_24GB.validate(&[p("2g.12gb", 0), p("1g.6gb", 2), p("1g.6gb", 3)]), Ok(()));
        assert!(A30_24GB.validate(&[p("4g.24gb", 0), p("1g.6gb", 3)]).is_err());
    }

    #[test]
    fn maximal_layouts_are_all_valid_and_include_the_known_ones() {
        for geometry in [&A100_40GB, &H200_141GB, &A30_24GB] {
            let layouts = geometry.maximal_layouts();
            assert!(!layouts.is_empty());
            for layout in &layouts {
                assert_eq!(geometry.validate(layout), Ok(()), "{layout:?}");
                for profile in geometry.profiles.iter().filter(|p| !p.media_extensions) {
                    assert_eq!(geometry.best_start(layout, profile), None, "{layout:?} is not maximal");
                }
            }
        }
        let layouts = A100_40GB.maximal_layouts();
        assert!(layouts.contains(&vec![p("4g.20gb", 0), p("3g.20gb", 4)]));
        assert!(layouts.contains(&vec![p("7g.40gb", 0)]));
        assert!(layouts.contains(&(0..7).map(|s| p("1g.5gb", s)).collect::<Vec<_>>()));
    }
}
