//! The CUDA C++ kernel sources, embedded in the binary and compiled by NVRTC at first use.

use crate::nvrtc::ProgramSource;

/// Headers any program may `#include "name"`.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    (
        "quant_formats.cuh",
        include_str!("../kernels/quant_formats.cuh"),
    ),
    ("segments.cuh", include_str!("../kernels/segments.cuh")),
    (
        "matvec_common.cuh",
        include_str!("../kernels/matvec_common.cuh"),
    ),
    ("int8_mma.cuh", include_str!("../kernels/int8_mma.cuh")),
];

/// One compilation unit (one CUDA module at run time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Program {
    MatvecQuant,
    /// One- and two-token Q4_K / IQ4_XS products with the weights loaded straight into
    /// registers (`REDLINE_MV_DIRECT`, crate::matvec).
    MatvecDirect,
    MatvecFloat,
    Bandwidth,
    Elementwise,
    Attention,
    /// The rest of the `backend::Backend` op set (crates/cuda/src/backend).
    ModelOps,
    /// Prefill GEMM feeding: dequantize to f16, x to f16 (crate::gemm).
    Gemm,
    /// Gated DeltaNet conv1d and delta rule, recurrent and chunked (crate::backend::recurrent).
    DeltaNet,
    /// Attention over the KV cache: split-KV decode and tensor-core prefill (crate::attention).
    FlashAttn,
    /// Small-batch (2..32 tokens) quantized products on int8 tensor cores (crate::mmq).
    Mmq,
    /// Few-token (1..8) quantized products on int8 tensor cores, fragments loaded straight
    /// from global memory (crate::mmv).
    Mmv,
}

impl Program {
    pub const ALL: [Program; 12] = [
        Program::MatvecQuant,
        Program::MatvecDirect,
        Program::MatvecFloat,
        Program::Bandwidth,
        Program::Elementwise,
        Program::Attention,
        Program::ModelOps,
        Program::Gemm,
        Program::DeltaNet,
        Program::FlashAttn,
        Program::Mmq,
        Program::Mmv,
    ];

    pub fn file_name(self) -> &'static str {
        match self {
            Program::MatvecQuant => "matvec_quant.cu",
            Program::MatvecDirect => "matvec_direct.cu",
            Program::MatvecFloat => "matvec_float.cu",
            Program::Bandwidth => "bandwidth.cu",
            Program::Elementwise => "elementwise.cu",
            Program::Attention => "attention.cu",
            Program::ModelOps => "model_ops.cu",
            Program::Gemm => "gemm.cu",
            Program::FlashAttn => "flash_attn.cu",
            Program::DeltaNet => "deltanet.cu",
            Program::Mmq => "mmq.cu",
            Program::Mmv => "mmv.cu",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Program::MatvecQuant => include_str!("../kernels/matvec_quant.cu"),
            Program::MatvecDirect => include_str!("../kernels/matvec_direct.cu"),
            Program::MatvecFloat => include_str!("../kernels/matvec_float.cu"),
            Program::Bandwidth => include_str!("../kernels/bandwidth.cu"),
            Program::Elementwise => include_str!("../kernels/elementwise.cu"),
            Program::Attention => include_str!("../kernels/attention.cu"),
            Program::ModelOps => include_str!("../kernels/model_ops.cu"),
            Program::Gemm => include_str!("../kernels/gemm.cu"),
            Program::FlashAttn => include_str!("../kernels/flash_attn.cu"),
            Program::DeltaNet => include_str!("../kernels/deltanet.cu"),
            Program::Mmq => include_str!("../kernels/mmq.cu"),
            Program::Mmv => include_str!("../kernels/mmv.cu"),
        }
    }

    /// The program with its headers: the embedded sources, or with `REDLINE_KERNEL_DIR` set
    /// (a kernel developer's knob), the files of that folder where it has them, so a kernel
    /// edit runs without rebuilding the binary (the cache key hashes the text actually used).
    pub fn program_source(self) -> ProgramSource<'static> {
        let (source, headers) = match override_dir() {
            Some(o) => (
                o.programs
                    .iter()
                    .find(|(p, _)| *p == self)
                    .map_or(self.source(), |(_, s)| s.as_str()),
                o.headers.as_slice(),
            ),
            None => (self.source(), HEADERS),
        };
        let mut prefix = String::new();
        if let (Some(mask), Program::ModelOps | Program::DeltaNet | Program::FlashAttn) =
            (pdl_early(), self)
        {
            prefix.push_str(&format!("#define REDLINE_PDL_EARLY {mask}\n"));
        }
        if crate::trace::config().is_some() {
            prefix.push_str("#define REDLINE_TRACE 1\n");
        }
        let source = if prefix.is_empty() {
            source
        } else {
            with_prefix(self, source, &prefix)
        };
        ProgramSource {
            name: self.file_name(),
            source,
            headers,
        }
    }
}

/// `REDLINE_PDL_EARLY=mask` (a kernel developer's knob, sm_90; unset: common.cuh's default,
/// 39): the small kernels of the classes set in the mask trigger their dependents before their
/// own PDL wait (`pdl_enter` in common.cuh says which bit is which; 0: none), so the next
/// product can start its pre-wait work a whole chain of small kernels earlier. Only the
/// programs holding such kernels get the `#define`, so the others keep their cache keys.
fn pdl_early() -> Option<u32> {
    static MASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *MASK.get_or_init(|| {
        let v = std::env::var("REDLINE_PDL_EARLY").ok()?;
        let mask = v.trim().parse::<u32>().ok()?;
        eprintln!(
            "REDLINE_PDL_EARLY={mask}: the kernel classes of this mask trigger their dependents \
             before their own wait"
        );
        Some(mask)
    })
}

/// `source` with the developer's `#define`s (`REDLINE_PDL_EARLY`, `REDLINE_TRACE`) in front,
/// made once per program.
fn with_prefix(program: Program, source: &'static str, prefix: &str) -> &'static str {
    type Texts = std::sync::Mutex<Vec<(Program, &'static str)>>;
    static TEXTS: std::sync::OnceLock<Texts> = std::sync::OnceLock::new();
    let mut texts = TEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, t)) = texts.iter().find(|(p, _)| *p == program) {
        return t;
    }
    let t: &'static str = Box::leak(format!("{prefix}{source}").into_boxed_str());
    texts.push((program, t));
    t
}

/// Sources read once from `REDLINE_KERNEL_DIR`.
struct Override {
    programs: Vec<(Program, String)>,
    headers: Vec<(&'static str, &'static str)>,
}

fn override_dir() -> Option<&'static Override> {
    static DIR: std::sync::OnceLock<Option<Override>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::path::PathBuf::from(std::env::var_os("REDLINE_KERNEL_DIR")?);
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let programs: Vec<(Program, String)> = Program::ALL
            .iter()
            .filter_map(|&p| read(p.file_name()).map(|s| (p, s)))
            .collect();
        let headers = HEADERS
            .iter()
            .map(|&(name, text)| {
                let t: &'static str = read(name).map_or(text, |s| Box::leak(s.into_boxed_str()));
                (name, t)
            })
            .collect();
        eprintln!(
            "REDLINE_KERNEL_DIR={}: {} kernel programs read from there instead of the built-in sources",
            dir.display(),
            programs.len()
        );
        Some(Override { programs, headers })
    })
    .as_ref()
}
