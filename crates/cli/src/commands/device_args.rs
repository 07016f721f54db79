//! Flags that choose the device and the placement, shared by `run`, `bench` and `serve`:
//! `--device auto|cpu|cuda[:N]`, `--fit on|gpu-only`, `-ngl N`, `--vram-limit BYTES`, and for
//! several cards `--split-mode`, `--tensor-split`, `--main-gpu`, `--devices` (see
//! `commands::multi_gpu`).

use std::ffi::OsString;
use std::fmt;

use model::plan::{FitMode, SplitMode};

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The GPU when one is usable, else the CPU (saying why once).
    Auto,
    Cpu,
    /// CUDA device ordinal; failing to open it is an error.
    Cuda(usize),
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => write!(f, "auto"),
            DeviceChoice::Cpu => write!(f, "cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// `auto`, `cpu`, `cuda`, `cuda:N` (also `gpu`, `gpu:N`).
pub fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || format!("expected auto, cpu, cuda or cuda:N, got {s:?}");
    match t.as_str() {
        "auto" => return Ok(DeviceChoice::Auto),
        "cpu" => return Ok(DeviceChoice::Cpu),
        "cuda" | "gpu" => return Ok(DeviceChoice::Cuda(0)),
        _ => {}
    }
    let n = t
        .strip_prefix("cuda:")
        .or_else(|| t.strip_prefix("gpu:"))
        .ok_or_else(bad)?;
    n.parse::<usize>()
        .map(DeviceChoice::Cuda)
        .map_err(|_| bad())
}

/// `on` or `gpu-only`.
pub fn parse_fit(s: &str) -> Result<FitMode, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "auto" => Ok(FitMode::On),
        "gpu-only" | "gpuonly" | "gpu_only" => Ok(FitMode::GpuOnly),
        _ => Err(format!("expected on or gpu-only, got {s:?}")),
    }
}

/// A memory size: `16G`, `16GiB`, `15.5GB`, `12000MiB`, `512M`, or a bare byte count.
/// K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB powers of 1000.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("expected a size like 16G, 16GiB, 15.5GB or a byte count, got {s:?}");
    let x: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => (1u64 << 20) as f64,
        "mb" => 1e6,
        "g" | "gib" => (1u64 << 30) as f64,
        "gb" => 1e9,
        "t" | "tib" => (1u64 << 40) as f64,
        "tb" => 1e12,
        _ => return Err(bad()),
    };
    let bytes = x * mult;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is not a usable size"));
    }
    Ok(bytes as u64)
}

/// `--tensor-split 3,1`: each card's share (llama.cpp's proportions; see
/// `model::plan::split::parse_tensor_split`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSplit(pub Vec<f64>);

pub fn parse_tensor_split(s: &str) -> Result<TensorSplit, String> {
    model::plan::split::parse_tensor_split(s).map(TensorSplit)
}

/// `--devices cuda:0,cuda:1`: the CUDA ordinals to split over (repeats make logical cards).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceList(pub Vec<usize>);

pub fn parse_devices(s: &str) -> Result<DeviceList, String> {
    s.split(',')
        .map(|d| match parse_device(d)? {
            DeviceChoice::Cuda(n) => Ok(n),
            other => Err(format!("--devices lists CUDA cards (cuda:N), got {other}")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(DeviceList)
}

pub fn parse_split_mode(s: &str) -> Result<SplitMode, String> {
    s.parse()
}

/// clap has one-letter short flags only; llama.cpp users type `-ngl N` (and `-ngl=N`).
/// Rewrites those to `--ngl` before parsing.
pub fn rewrite_llama_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| match a.to_str() {
            Some("-ngl") => OsString::from("--ngl"),
            Some("-md") => OsString::from("--md"),
            Some("-sm") => OsString::from("--split-mode"),
            Some("-ts") => OsString::from("--tensor-split"),
            Some("-mg") => OsString::from("--main-gpu"),
            Some(s) if s.starts_with("-ngl=") => OsString::from(format!("-{s}")),
            _ => a,
        })
        .collect()
}

/// The device and placement flags.
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Where to run: auto (the GPU when one is usable, else the CPU), cpu, cuda, cuda:N.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// on: choose the context (up to -c, the model's maximum, or 4096 per slot) and put every
    /// layer on the GPU when it fits, else offload the rest to the CPU with a warning;
    /// gpu-only: refuse to start (printing the memory ledger and what would fit) unless
    /// everything fits on the GPU.
    #[arg(long, default_value = "on", value_parser = parse_fit)]
    pub fit: FitMode,
    /// Force this many layers on the GPU (the output head counts as the first), as llama.cpp's
    /// -ngl.
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    pub n_gpu_layers: Option<usize>,
    /// Use at most this much GPU memory (16G, 16GiB, 15.5GB, 12000MiB …), to share a card or
    /// to see how a smaller card would run.
    #[arg(long = "vram-limit", value_parser = parse_bytes)]
    pub vram_limit: Option<u64>,
    /// How to use several GPUs (llama.cpp's -sm): layer (each card holds a run of whole
    /// layers, the output head on the last; the default when several cards are visible or
    /// listed by --devices), tensor (every matrix split across the cards; planned, not run
    /// yet), none (one card: --main-gpu).
    #[arg(long = "split-mode", value_parser = parse_split_mode)]
    pub split_mode: Option<SplitMode>,
    /// Share of the layers each card takes, e.g. 3,1 (llama.cpp's -ts); default: in
    /// proportion to each card's free memory.
    #[arg(long = "tensor-split", value_parser = parse_tensor_split)]
    pub tensor_split: Option<TensorSplit>,
    /// The card used with --split-mode none (llama.cpp's -mg).
    #[arg(long = "main-gpu", default_value_t = 0)]
    pub main_gpu: usize,
    /// The cards to split over, e.g. cuda:0,cuda:1 (default: every visible GPU). Repeating a
    /// card (cuda:0,cuda:0) makes logical cards of one GPU, each with its own stream and half
    /// its memory: a way to test and measure the split on one GPU.
    #[arg(long = "devices", value_parser = parse_devices)]
    pub devices: Option<DeviceList>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        p: PlacementArgs,
    }

    fn parse(args: &[&str]) -> Result<PlacementArgs, clap::Error> {
        let argv = rewrite_llama_flags(
            std::iter::once("redline")
                .chain(args.iter().copied())
                .map(OsString::from),
        );
        Cli::try_parse_from(argv).map(|c| c.p)
    }

    #[test]
    fn device_names() {
        assert_eq!(parse_device("auto"), Ok(DeviceChoice::Auto));
        assert_eq!(parse_device("CPU"), Ok(DeviceChoice::Cpu));
        assert_eq!(parse_device("cuda"), Ok(DeviceChoice::Cuda(0)));
        assert_eq!(parse_device("cuda:3"), Ok(DeviceChoice::Cuda(3)));
        assert_eq!(parse_device("gpu:1"), Ok(DeviceChoice::Cuda(1)));
        assert!(parse_device("cuda:").is_err());
        assert!(parse_device("cuda:-1").is_err());
        assert!(parse_device("metal").is_err());
        assert_eq!(DeviceChoice::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("16G"), Ok(16 << 30));
        assert_eq!(parse_bytes("16GiB"), Ok(16 << 30));
        assert_eq!(parse_bytes("16gb"), Ok(16_000_000_000));
        assert_eq!(parse_bytes("15.5GiB"), Ok(15 * (1 << 30) + (1 << 29)));
        assert_eq!(parse_bytes("12000MiB"), Ok(12000 << 20));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes(" 2 KiB "), Ok(2048));
        for bad in [
            "",
            "G",
            "abc",
            "16XB",
            "0",
            "0.1",
            "-5G",
            "1.2.3G",
            "99999999999T",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_parse_with_defaults_and_llama_spellings() {
        let p = parse(&[]).unwrap();
        assert_eq!(p.device, DeviceChoice::Auto);
        assert_eq!(p.fit, FitMode::On);
        assert_eq!(p.n_gpu_layers, None);
        assert_eq!(p.vram_limit, None);
        let p = parse(&[
            "--device",
            "cuda:1",
            "--fit",
            "gpu-only",
            "-ngl",
            "20",
            "--vram-limit",
            "16G",
        ])
        .unwrap();
        assert_eq!(p.device, DeviceChoice::Cuda(1));
        assert_eq!(p.fit, FitMode::GpuOnly);
        assert_eq!(p.n_gpu_layers, Some(20));
        assert_eq!(p.vram_limit, Some(16 << 30));
        assert_eq!(parse(&["-ngl=7"]).unwrap().n_gpu_layers, Some(7));
        assert_eq!(
            parse(&["--n-gpu-layers", "0"]).unwrap().n_gpu_layers,
            Some(0)
        );
        assert!(parse(&["--fit", "maybe"]).is_err());
        assert!(parse(&["--vram-limit", "lots"]).is_err());
        assert!(parse(&["--device", "tpu"]).is_err());
    }

    #[test]
    fn several_card_flags() {
        let p = parse(&[]).unwrap();
        assert_eq!((p.split_mode, p.main_gpu), (None, 0));
        assert!(p.tensor_split.is_none() && p.devices.is_none());
        let p = parse(&[
            "-sm",
            "layer",
            "-ts",
            "3,1",
            "-mg",
            "1",
            "--devices",
            "cuda:0,cuda:0",
        ])
        .unwrap();
        assert_eq!(p.split_mode, Some(SplitMode::Layer));
        assert_eq!(p.tensor_split, Some(TensorSplit(vec![3.0, 1.0])));
        assert_eq!(p.main_gpu, 1);
        assert_eq!(p.devices, Some(DeviceList(vec![0, 0])));
        assert_eq!(
            parse(&["--split-mode", "row"]).unwrap().split_mode,
            Some(SplitMode::Tensor)
        );
        assert!(parse(&["--split-mode", "rows"]).is_err());
        assert!(parse(&["--tensor-split", "0,0"]).is_err());
        assert!(parse(&["--devices", "cuda:0,cpu"]).is_err());
    }
}
