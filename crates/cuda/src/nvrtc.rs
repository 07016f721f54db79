//! Our own run-time binding to NVRTC (libnvrtc), loaded with `libloading`.
//!
//! Why not cudarc's `nvrtc` module: cudarc looks the library up only by soname candidates fixed
//! at build time (the 12.x feature never tries `libnvrtc.so.13`) and panics when none loads.
//! We need (a) an explicit path (the PyPI wheel in CI), (b) whichever of CUDA 12.x / 13.x is
//! installed, newest first, and (c) errors instead of panics. The C API used here
//! (nvrtcCreateProgram … nvrtcGetCUBIN) is unchanged from CUDA 11.2 to 13.x.

use crate::error::{CudaError, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

type NvrtcResult = c_int;
type Program = *mut c_void;

/// Function table of one loaded libnvrtc.
pub struct Nvrtc {
    path: PathBuf,
    version: (i32, i32),
    supported_archs: Vec<u32>,
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    get_log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    // Keeps the function pointers above valid; dropped last.
    _lib: libloading::Library,
}

/// Output of one compilation plus NVRTC's log (warnings).
pub struct Compiled {
    /// What `cuModuleLoadData` takes: a cubin for exactly one `sm_XX` ([`Nvrtc::compile`]), or
    /// NUL-terminated PTX text for `compute_XX` ([`Nvrtc::compile_ptx`]; the driver compiles it
    /// for the card it is loaded on).
    pub image: Vec<u8>,
    pub log: String,
}

/// What NVRTC emits: a cubin for one real architecture, or PTX for a virtual one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `--gpu-architecture=sm_XX`, the cubin.
    Cubin(u32),
    /// `--gpu-architecture=compute_XX`, the PTX.
    Ptx(u32),
}

impl Target {
    pub fn arch(self) -> u32 {
        match self {
            Target::Cubin(a) | Target::Ptx(a) => a,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Cubin(a) => write!(f, "sm_{a}"),
            Target::Ptx(a) => write!(f, "compute_{a}"),
        }
    }
}

/// One source file of a kernel program and the headers it `#include`s by name.
pub struct ProgramSource<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
}

/// Library file names tried, newest CUDA first (13.x, then 12.x, then an unversioned link).
pub const SONAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Directories where a CUDA toolkit or the NVIDIA PyPI wheels usually put libnvrtc.
/// `CUDA_HOME` / `CUDA_PATH` are the conventional toolkit variables.
pub fn candidate_paths() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib64"));
            dirs.push(Path::new(&v).join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.extend(glob_dirs("/usr/local", "cuda-", "lib64"));
    // PyPI wheels: nvidia-cuda-nvrtc-cu12 -> nvidia/cuda_nvrtc/lib, nvidia-cuda-nvrtc (13) ->
    // nvidia/cu13/lib, inside any site-packages we can see.
    for sp in site_packages_dirs() {
        dirs.push(sp.join("nvidia/cu13/lib"));
        dirs.push(sp.join("nvidia/cuda_nvrtc/lib"));
    }
    let mut out = Vec::new();
    for d in dirs {
        for so in SONAMES {
            let p = d.join(so);
            if p.exists() {
                out.push(p);
            }
        }
    }
    out
}

pub(crate) fn glob_dirs(parent: &str, prefix: &str, sub: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path().join(sub))
        .collect();
    v.sort();
    v.reverse(); // newest version first
    v
}

pub(crate) fn site_packages_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = vec!["/usr/lib".into(), "/usr/local/lib".into()];
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(Path::new(&venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
    }
    let mut out = Vec::new();
    for r in roots {
        for py in glob_dirs(&r.to_string_lossy(), "python3", "") {
            out.push(py.join("site-packages"));
            out.push(py.join("dist-packages"));
        }
    }
    out
}

impl Nvrtc {
    /// Loads NVRTC: `explicit` if given, else by soname through the system loader, else from
    /// [`candidate_paths`]. Never panics; a missing library is `NvrtcNotFound`.
    pub fn load(explicit: Option<&Path>) -> Result<Nvrtc> {
        if let Some(p) = explicit {
            return Nvrtc::load_path(p);
        }
        let mut tried = Vec::new();
        for so in SONAMES {
            match Nvrtc::load_path(Path::new(so)) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{so} ({e})")),
            }
        }
        for p in candidate_paths() {
            match Nvrtc::load_path(&p) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{} ({e})", p.display())),
            }
        }
        Err(CudaError::NvrtcNotFound {
            searched: tried.join("; "),
        })
    }

    /// Loads the library at `path` (a file path, or a bare soname for the system loader).
    pub fn load_path(path: &Path) -> Result<Nvrtc> {
        let load_err = |reason: String| CudaError::NvrtcLoad {
            path: path.to_path_buf(),
            reason,
        };
        // SAFETY: loading libnvrtc runs only its (side-effect free) initializers.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| load_err(e.to_string()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's C signature is NVRTC's documented one, matching the
                // field type it is stored into.
                *unsafe { lib.get($name) }.map_err(|e| load_err(e.to_string()))?
            };
        }
        let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult =
            sym!(b"nvrtcVersion\0");
        let num_archs_fn: unsafe extern "C" fn(*mut c_int) -> NvrtcResult =
            sym!(b"nvrtcGetNumSupportedArchs\0");
        let archs_fn: unsafe extern "C" fn(*mut c_int) -> NvrtcResult =
            sym!(b"nvrtcGetSupportedArchs\0");
        let (mut major, mut minor, mut n) = (0, 0, 0);
        // SAFETY: out-pointers to live locals.
        unsafe {
            version_fn(&mut major, &mut minor);
            num_archs_fn(&mut n);
        }
        let mut archs = vec![0 as c_int; n.clamp(0, 256) as usize];
        if !archs.is_empty() {
            // SAFETY: `archs` holds exactly the count NVRTC reported.
            unsafe { archs_fn(archs.as_mut_ptr()) };
        }
        Ok(Nvrtc {
            path: path.to_path_buf(),
            version: (major, minor),
            supported_archs: archs.into_iter().map(|a| a as u32).collect(),
            get_error_string: sym!(b"nvrtcGetErrorString\0"),
            create_program: sym!(b"nvrtcCreateProgram\0"),
            compile_program: sym!(b"nvrtcCompileProgram\0"),
            destroy_program: sym!(b"nvrtcDestroyProgram\0"),
            get_log_size: sym!(b"nvrtcGetProgramLogSize\0"),
            get_log: sym!(b"nvrtcGetProgramLog\0"),
            get_cubin_size: sym!(b"nvrtcGetCUBINSize\0"),
            get_cubin: sym!(b"nvrtcGetCUBIN\0"),
            get_ptx_size: sym!(b"nvrtcGetPTXSize\0"),
            get_ptx: sym!(b"nvrtcGetPTX\0"),
            _lib: lib,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (major, minor) of this NVRTC, e.g. (12, 9).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Real architectures this NVRTC can emit cubins for (e.g. 70, 75, 80, … 90).
    pub fn supported_archs(&self) -> &[u32] {
        &self.supported_archs
    }

    fn check(&self, call: &'static str, r: NvrtcResult) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
        let message = unsafe { CStr::from_ptr((self.get_error_string)(r)) }
            .to_string_lossy()
            .into_owned();
        Err(CudaError::Nvrtc { call, message })
    }

    /// Compiles `src` to a cubin for `sm_{arch}` (e.g. 70, 90). A compile error returns
    /// `CudaError::Compile` with NVRTC's log.
    pub fn compile(
        &self,
        src: &ProgramSource,
        arch: u32,
        extra_options: &[&str],
    ) -> Result<Compiled> {
        self.compile_for(src, Target::Cubin(arch), extra_options)
    }

    /// Compiles `src` to PTX for `compute_{arch}`: code for that architecture (its
    /// `__CUDA_ARCH__`) that the driver compiles for any newer card it is loaded on.
    pub fn compile_ptx(
        &self,
        src: &ProgramSource,
        arch: u32,
        extra_options: &[&str],
    ) -> Result<Compiled> {
        self.compile_for(src, Target::Ptx(arch), extra_options)
    }

    /// [`Self::compile`] or [`Self::compile_ptx`] by `target`.
    pub fn compile_for(
        &self,
        src: &ProgramSource,
        target: Target,
        extra_options: &[&str],
    ) -> Result<Compiled> {
        let arch = target.arch();
        if !self.supported_archs.is_empty() && !self.supported_archs.contains(&arch) {
            return Err(CudaError::ArchUnsupported {
                version: format!("{}.{}", self.version.0, self.version.1),
                arch,
                supported: self.supported_archs.clone(),
            });
        }
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| CudaError::Nvrtc {
                call: "nvrtcCreateProgram",
                message: "NUL in source".into(),
            })
        };
        let c_src = cstr(src.source)?;
        let c_name = cstr(src.name)?;
        let hdr_src: Vec<CString> = src
            .headers
            .iter()
            .map(|(_, s)| cstr(s))
            .collect::<Result<_>>()?;
        let hdr_name: Vec<CString> = src
            .headers
            .iter()
            .map(|(n, _)| cstr(n))
            .collect::<Result<_>>()?;
        let hdr_src_p: Vec<*const c_char> = hdr_src.iter().map(|c| c.as_ptr()).collect();
        let hdr_name_p: Vec<*const c_char> = hdr_name.iter().map(|c| c.as_ptr()).collect();
        let arch_opt = format!("--gpu-architecture={target}");
        let mut opts: Vec<CString> = vec![cstr(&arch_opt)?, cstr("--std=c++17")?];
        for o in extra_options {
            opts.push(cstr(o)?);
        }
        let opts_p: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: all pointers point into CStrings alive for this call; counts match.
        self.check("nvrtcCreateProgram", unsafe {
            (self.create_program)(
                &mut prog,
                c_src.as_ptr(),
                c_name.as_ptr(),
                hdr_src_p.len() as c_int,
                hdr_src_p.as_ptr(),
                hdr_name_p.as_ptr(),
            )
        })?;
        let result = self.compile_created(prog, &opts_p, src.name, target);
        // SAFETY: `prog` was created above and is destroyed exactly once.
        unsafe { (self.destroy_program)(&mut prog) };
        result
    }

    fn compile_created(
        &self,
        prog: Program,
        opts: &[*const c_char],
        name: &str,
        target: Target,
    ) -> Result<Compiled> {
        // SAFETY: `prog` is a live program; option pointers are valid C strings.
        let r = unsafe { (self.compile_program)(prog, opts.len() as c_int, opts.as_ptr()) };
        let log = self.log(prog)?;
        if r != 0 {
            return Err(CudaError::Compile {
                kernel: name.to_string(),
                arch: target.to_string(),
                log,
            });
        }
        let (size_fn, get_fn, calls) = match target {
            Target::Cubin(_) => (
                self.get_cubin_size,
                self.get_cubin,
                ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
            ),
            // the size counts the terminating NUL, which cuModuleLoadData needs
            Target::Ptx(_) => (
                self.get_ptx_size,
                self.get_ptx,
                ("nvrtcGetPTXSize", "nvrtcGetPTX"),
            ),
        };
        let mut size = 0usize;
        // SAFETY: out-pointer to a live local.
        self.check(calls.0, unsafe { size_fn(prog, &mut size) })?;
        let mut image = vec![0u8; size];
        // SAFETY: `image` has exactly the size NVRTC reported.
        self.check(calls.1, unsafe {
            get_fn(prog, image.as_mut_ptr() as *mut c_char)
        })?;
        Ok(Compiled { image, log })
    }

    fn log(&self, prog: Program) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: out-pointer to a live local.
        self.check("nvrtcGetProgramLogSize", unsafe {
            (self.get_log_size)(prog, &mut size)
        })?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` has the size NVRTC reported (it includes the NUL).
        self.check("nvrtcGetProgramLog", unsafe {
            (self.get_log)(prog, buf.as_mut_ptr() as *mut c_char)
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim().to_string())
    }
}
