//! Built-in table of common GPUs for what-if plans: memory and bandwidth.
//!
//! `usable` is the total a process sees (cuMemGetInfo's total; nvidia-smi's "Total" on
//! pre-Hopper cards): the marketing size less what ECC and the driver reserve (16 GiB V100 →
//! 16160 MiB). On the H200 the driver hides another 615 MiB: nvidia-smi says 143771 MiB,
//! cuMemGetInfo 143156 MiB (measured, driver 580); the H100 figure is nvidia-smi's and may be
//! optimistic by a similar share. The runtime's own context is a separate ledger line. Bandwidth is the datasheet peak in GB/s (10^9 bytes/s); a large read reaches
//! ~85–92 % of it (4259 of 4800 GB/s measured on an H200, shared/BENCHMARKING.md), so decode
//! ceilings computed from it are upper bounds.

use serde::Serialize;

use super::buffers::RUNTIME_OVERHEAD_BYTES;

/// Pre-Hopper cards: the documented estimate. Hopper: measured on the H200 (685 MiB).
const RT: u64 = RUNTIME_OVERHEAD_BYTES >> 20;
const RT_HOPPER: u64 = 700;

/// A device the planner places weights on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSpec {
    pub name: String,
    /// Memory as sold.
    pub vram_bytes: u64,
    /// Memory a process can allocate from (before the runtime's own context).
    pub usable_bytes: u64,
    /// Peak memory bandwidth, GB/s.
    pub bandwidth_gbs: f64,
    /// Estimated device memory of the CUDA context, cuBLAS and our modules.
    pub runtime_overhead_bytes: u64,
}

struct GpuEntry {
    /// Lookup names, normalized (lowercase alphanumerics); the first is the canonical key.
    keys: &'static [&'static str],
    name: &'static str,
    vram_gib: u64,
    usable_mib: u64,
    bandwidth_gbs: f64,
    /// Runtime overhead, MiB (see [`RUNTIME_OVERHEAD_BYTES`]).
    runtime_mib: u64,
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

const TABLE: &[GpuEntry] = &[
    GpuEntry {
        keys: &["v10016gb", "v100", "v10016"],
        name: "NVIDIA V100 16 GB",
        vram_gib: 16,
        usable_mib: 16160,
        bandwidth_gbs: 900.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["v10032gb", "v10032"],
        name: "NVIDIA V100 32 GB",
        vram_gib: 32,
        usable_mib: 32510,
        bandwidth_gbs: 900.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["t4"],
        name: "NVIDIA T4",
        vram_gib: 16,
        usable_mib: 15360,
        bandwidth_gbs: 320.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["p40"],
        name: "NVIDIA P40",
        vram_gib: 24,
        usable_mib: 22919,
        bandwidth_gbs: 346.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["a10", "a1024gb"],
        name: "NVIDIA A10",
        vram_gib: 24,
        usable_mib: 23028,
        bandwidth_gbs: 600.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["l4"],
        name: "NVIDIA L4",
        vram_gib: 24,
        usable_mib: 23034,
        bandwidth_gbs: 300.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["a10040gb", "a10040"],
        name: "NVIDIA A100 40 GB",
        vram_gib: 40,
        usable_mib: 40960,
        bandwidth_gbs: 1555.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["a10080gb", "a10080", "a100"],
        name: "NVIDIA A100 80 GB",
        vram_gib: 80,
        usable_mib: 81920,
        bandwidth_gbs: 2039.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["rtx3090", "3090"],
        name: "NVIDIA GeForce RTX 3090",
        vram_gib: 24,
        usable_mib: 24576,
        bandwidth_gbs: 936.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["rtx4090", "4090"],
        name: "NVIDIA GeForce RTX 4090",
        vram_gib: 24,
        usable_mib: 24564,
        bandwidth_gbs: 1008.0,
        runtime_mib: RT,
    },
    GpuEntry {
        keys: &["h100", "h10080gb", "h100sxm"],
        name: "NVIDIA H100 80 GB (SXM)",
        vram_gib: 80,
        usable_mib: 81559,
        bandwidth_gbs: 3350.0,
        runtime_mib: RT_HOPPER,
    },
    GpuEntry {
        keys: &["h200", "h200141gb"],
        name: "NVIDIA H200 141 GB",
        vram_gib: 141,
        usable_mib: 143156,
        bandwidth_gbs: 4800.0,
        runtime_mib: RT_HOPPER,
    },
];

fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl GpuSpec {
    /// Looks a card up by name (`v100-16gb`, `A100 80GB`, `rtx4090` …; case, spaces and dashes
    /// ignored; a leading "nvidia" or "tesla" too).
    pub fn from_table(name: &str) -> Option<GpuSpec> {
        let mut n = normalize(name);
        for prefix in ["nvidia", "tesla", "geforce"] {
            if let Some(rest) = n.strip_prefix(prefix) {
                n = rest.to_owned();
            }
        }
        TABLE
            .iter()
            .find(|e| e.keys.contains(&n.as_str()))
            .map(GpuEntry::spec)
    }

    /// The canonical names `from_table` accepts, for help and error messages.
    pub fn table_names() -> Vec<&'static str> {
        vec![
            "v100-16gb",
            "v100-32gb",
            "t4",
            "p40",
            "a10",
            "l4",
            "a100-40gb",
            "a100-80gb",
            "rtx3090",
            "rtx4090",
            "h100",
            "h200",
        ]
    }

    /// Every card of the table.
    pub fn table() -> Vec<GpuSpec> {
        TABLE.iter().map(GpuEntry::spec).collect()
    }

    /// A card not in the table: `usable` bytes and `bandwidth_gbs`.
    pub fn custom(usable_bytes: u64, bandwidth_gbs: f64) -> GpuSpec {
        GpuSpec {
            name: "custom".into(),
            vram_bytes: usable_bytes,
            usable_bytes,
            bandwidth_gbs,
            runtime_overhead_bytes: RUNTIME_OVERHEAD_BYTES,
        }
    }
}

impl GpuEntry {
    fn spec(&self) -> GpuSpec {
        GpuSpec {
            name: self.name.to_owned(),
            vram_bytes: self.vram_gib * GIB,
            usable_bytes: self.usable_mib * MIB,
            bandwidth_gbs: self.bandwidth_gbs,
            runtime_overhead_bytes: self.runtime_mib * MIB,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_canonical_name_resolves_and_usable_is_below_vram() {
        let names = GpuSpec::table_names();
        assert_eq!(names.len(), TABLE.len());
        for n in names {
            let g = GpuSpec::from_table(n).unwrap_or_else(|| panic!("{n}"));
            assert!(g.usable_bytes <= g.vram_bytes, "{n}");
            assert!(g.usable_bytes > g.vram_bytes / 100 * 93, "{n}");
        }
    }

    #[test]
    fn lookup_ignores_case_and_punctuation() {
        let v = GpuSpec::from_table("Tesla V100-16GB").unwrap();
        assert_eq!(v.usable_bytes, 16160 * MIB);
        assert_eq!(v.bandwidth_gbs, 900.0);
        assert_eq!(GpuSpec::from_table("v100").unwrap(), v);
        assert_eq!(
            GpuSpec::from_table("A100 80GB").unwrap().name,
            "NVIDIA A100 80 GB"
        );
        assert_eq!(
            GpuSpec::from_table("NVIDIA GeForce RTX 4090")
                .unwrap()
                .bandwidth_gbs,
            1008.0
        );
        assert!(GpuSpec::from_table("v101").is_none());
    }
}
