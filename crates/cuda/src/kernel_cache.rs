//! On-disk cache of compiled kernels: `<cache dir>/redline/kernels/<key>.cubin` (a cubin, or
//! the PTX of a `compute_XX` target: whatever `cuModuleLoadData` takes).
//!
//! The key hashes everything that changes the output: the program's source and headers, the
//! target architecture, the NVRTC version and the compile options. A stale or corrupt entry
//! can only cost a recompile: a file that fails to load as a module is recompiled and replaced.

use crate::error::{CudaError, Result};
use crate::nvrtc::{ProgramSource, Target};
use std::path::{Path, PathBuf};

/// `$XDG_CACHE_HOME/redline/kernels`, else `$HOME/.cache/redline/kernels` (the conventional
/// cache variables); `None` when neither is set (then nothing is cached).
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("redline").join("kernels"))
}

/// 128-bit FNV-1a over the parts, each prefixed by its length so that part boundaries count.
fn fnv1a128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for p in parts {
        for b in (p.len() as u64).to_le_bytes().iter().chain(p.iter()) {
            h ^= *b as u128;
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The cache key of one compilation, as a file stem: `<program>-sm<arch>-nvrtc<M.m>-<hash>`
/// (`-compute<arch>-` for PTX).
pub fn cache_key(
    src: &ProgramSource,
    target: Target,
    nvrtc_version: (i32, i32),
    options: &[&str],
) -> String {
    let mut parts: Vec<&[u8]> = vec![src.source.as_bytes()];
    for (name, text) in src.headers {
        parts.push(name.as_bytes());
        parts.push(text.as_bytes());
    }
    let opts = options.join("\u{1}");
    parts.push(opts.as_bytes());
    let stem = src.name.trim_end_matches(".cu");
    let h = fnv1a128(&parts);
    let t = match target {
        Target::Cubin(a) => format!("sm{a}"),
        Target::Ptx(a) => format!("compute{a}"),
    };
    format!(
        "{stem}-{t}-nvrtc{}.{}-{h:032x}",
        nvrtc_version.0, nvrtc_version.1
    )
}

pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    pub fn new(dir: Option<PathBuf>) -> KernelCache {
        KernelCache { dir }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.cubin")))
    }

    /// The cached cubin, if present and readable.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.path(key)?).ok()?;
        (!bytes.is_empty()).then_some(bytes)
    }

    /// Stores atomically (write to a temp file, then rename) so concurrent processes never
    /// see half a file.
    pub fn put(&self, key: &str, cubin: &[u8]) -> Result<()> {
        let (Some(dir), Some(path)) = (self.dir.as_ref(), self.path(key)) else {
            return Ok(());
        };
        let io = |source| CudaError::CacheIo {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = dir.join(format!(".{key}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, cubin).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src<'a>(s: &'a str, h: &'a [(&'a str, &'a str)]) -> ProgramSource<'a> {
        ProgramSource {
            name: "k.cu",
            source: s,
            headers: h,
        }
    }

    #[test]
    fn key_changes_with_every_input() {
        let h: &[(&str, &str)] = &[("a.cuh", "int a;")];
        let base = cache_key(&src("x", h), Target::Cubin(90), (12, 9), &["-O3"]);
        assert_eq!(
            base,
            cache_key(&src("x", h), Target::Cubin(90), (12, 9), &["-O3"])
        );
        assert!(base.starts_with("k-sm90-nvrtc12.9-"));
        assert_ne!(
            base,
            cache_key(&src("y", h), Target::Cubin(90), (12, 9), &["-O3"])
        );
        assert_ne!(
            base,
            cache_key(
                &src("x", &[("a.cuh", "int b;")]),
                Target::Cubin(90),
                (12, 9),
                &["-O3"]
            )
        );
        assert_ne!(
            base,
            cache_key(&src("x", h), Target::Cubin(80), (12, 9), &["-O3"])
        );
        // the PTX of the same architecture is another entry
        let ptx = cache_key(&src("x", h), Target::Ptx(90), (12, 9), &["-O3"]);
        assert_ne!(base, ptx);
        assert!(ptx.starts_with("k-compute90-nvrtc12.9-"));
        assert_ne!(
            base,
            cache_key(&src("x", h), Target::Cubin(90), (13, 0), &["-O3"])
        );
        assert_ne!(
            base,
            cache_key(&src("x", h), Target::Cubin(90), (12, 9), &[])
        );
        // part boundaries matter: ("ab","") vs ("a","b")
        assert_ne!(fnv1a128(&[b"ab", b""]), fnv1a128(&[b"a", b"b"]));
    }

    #[test]
    fn put_then_get_round_trips() {
        let dir = std::env::temp_dir().join(format!("redline-kcache-test-{}", std::process::id()));
        let c = KernelCache::new(Some(dir.clone()));
        assert!(c.get("k1").is_none());
        c.put("k1", b"\x7fELFcubin").unwrap();
        assert_eq!(c.get("k1").unwrap(), b"\x7fELFcubin");
        std::fs::remove_dir_all(dir).unwrap();
        // no directory: a no-op cache
        let none = KernelCache::new(None);
        none.put("k", b"x").unwrap();
        assert!(none.get("k").is_none());
    }
}
