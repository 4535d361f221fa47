//! NVIDIA's own NVRTC, from the package registry (PyPI's `nvidia-cuda-nvrtc` for CUDA 13 and
//! `nvidia-cuda-nvrtc-cu12` for CUDA 12), which compiles CUDA C++ on any x86-64 machine, GPU or
//! not: `scripts/test` installs both into the target directory and names the libraries in
//! [`NVRTC13`] and [`NVRTC12`], and CUDA 12.9's `ptxas` (`nvidia-cuda-nvcc-cu12`) in [`PTXAS`]. What tells NVIDIA's output apart: a cubin is an ELF of
//! `EM_CUDA` for one architecture. And the kernels that `tests/cuda_real_nvrtc.rs` compiles,
//! which `scripts/gpu-check` compiles again on a GPU ([`check_kernels`]).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use kcache::Error;
use kcache::backend::cuda::{Context, CudaCache, Nvrtc};

use crate::needs;

/// The variable naming CUDA 13's `libnvrtc.so.13`.
pub const NVRTC13: &str = "KCACHE_TEST_NVRTC13";
/// The variable naming CUDA 12's `libnvrtc.so.12`.
pub const NVRTC12: &str = "KCACHE_TEST_NVRTC12";

/// Set by `scripts/test`, to why, where PyPI cannot be reached: the tests are skipped even
/// under [`needs::REQUIRE_ALL`], as nothing on the machine could have installed NVRTC.
pub const UNREACHABLE: &str = "KCACHE_TEST_NVRTC_UNREACHABLE";

/// The variable naming CUDA 12.9's `ptxas` (PyPI's `nvidia-cuda-nvcc-cu12`).
pub const PTXAS: &str = "KCACHE_TEST_PTXAS";

/// What `scripts/test` installs: the variable, the package and version, the folder under
/// `target/nvrtc` and the file in it.
const INSTALLED: [(&str, &str, &str, &str); 3] = [
    (
        NVRTC13,
        "nvidia-cuda-nvrtc==13.2.78",
        "cu13",
        "nvidia/cu13/lib/libnvrtc.so.13",
    ),
    (
        NVRTC12,
        "nvidia-cuda-nvrtc-cu12==12.9.86",
        "cu12",
        "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
    ),
    (
        PTXAS,
        "nvidia-cuda-nvcc-cu12==12.9.86",
        "nvcc12",
        "nvidia/cuda_nvcc/bin/ptxas",
    ),
];

/// The NVRTC library [`NVRTC13`] or [`NVRTC12`] names, loaded; `None` once the test is said to
/// be skipped when it is missing (see [`needs`]).
pub fn real_nvrtc(var: &str) -> Option<Arc<Nvrtc>> {
    let path = installed(var)?;
    Some(Arc::new(Nvrtc::load_from(&path).unwrap()))
}

/// NVIDIA's `ptxas`, as [`PTXAS`] names it; `None` once the test is said to be skipped.
pub fn real_ptxas() -> Option<PathBuf> {
    installed(PTXAS)
}

/// What `var` names, else where `scripts/test` installs it; `None` once the test is said to be
/// skipped when it is in neither place.
fn installed(var: &str) -> Option<PathBuf> {
    if let Some(why) = std::env::var_os(UNREACHABLE) {
        // One write to the standard error itself, as needs::met says a skip.
        let line = format!(
            "skipped: NVIDIA's compilers are not installed: {}\n",
            why.display()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
        return None;
    }
    let (_, package, folder, file) = INSTALLED
        .into_iter()
        .find(|(v, ..)| *v == var)
        .expect("a variable of this module");
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        // The test kit's manifest is one level down from the workspace's target directory.
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/nvrtc")
            .join(folder)
            .join(file)
    });
    let install = format!(
        "run scripts/test, or `python3 -m pip install --target target/nvrtc/{folder} \
         {package}`, or set {var}"
    );
    needs::met(needs::file(path, &install))
}

/// `EM_CUDA`, the ELF machine of NVIDIA's cubins.
pub const EM_CUDA: u16 = 190;

/// The architecture (`80` for `sm_80`) of the cubin `image`, an ELF64 of [`EM_CUDA`]; `None`
/// for anything else. The ELF flags name it in bits 0-7 up to the ELF ABI version 7 (CUDA 12)
/// and in bits 8-15 from version 8 (CUDA 13) on.
pub fn cubin_arch(image: &[u8]) -> Option<u32> {
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != 2 {
        return None;
    }
    let machine = u16::from_le_bytes([image[18], image[19]]);
    if machine != EM_CUDA {
        return None;
    }
    let flags = u32::from_le_bytes(image[48..52].try_into().unwrap());
    Some(if image[8] >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    })
}

/// A kernel whose body and name come from a header found through `-I` ([`header`]).
pub const WITH_HEADER: &str = "#include \"scale.h\"\n\
                               extern \"C\" __global__ void KERNEL(float *x) {\n\
                               x[threadIdx.x] = scaled(x[threadIdx.x]);\n}\n";

/// A kernel reading an in-memory header (`factor.h`, handed to NVRTC, defining `FACTOR`) and
/// a file through `-I` ([`header`]).
pub const WITH_BOTH: &str = "#include \"factor.h\"\n#include \"scale.h\"\n\
                             extern \"C\" __global__ void KERNEL(float *x) {\n\
                             x[threadIdx.x] = scaled(FACTOR);\n}\n";

/// A template kernel, instantiated for `float`: found by its mangled name, [`TEMPLATE_FLOAT`].
pub const TEMPLATE: &str = "template <typename T> __global__ void scale(T *x, T a) {\n\
                            x[threadIdx.x] *= a;\n}\n\
                            template __global__ void scale<float>(float *, float);\n";
/// The mangled name of `scale<float>`.
pub const TEMPLATE_FLOAT: &str = "_Z5scaleIfEvPT_S0_";

/// A kernel that does not compile: `missing_name` is undefined.
pub const BROKEN: &str = "extern \"C\" __global__ void k(float *x) { x[0] = missing_name; }\n";

/// The header `scale.h` of [`WITH_HEADER`] and [`WITH_BOTH`], naming their kernel `name`.
pub fn header(name: &str) -> String {
    format!(
        "#define KERNEL {name}\n__device__ inline float scaled(float v) {{ return 2.0f * v; }}\n"
    )
}

/// Compiles the kernels above through `cache` for `context`'s device (no `-arch`: kcache picks
/// it) and looks each up: a header through `-I`, an in-memory header, a template by its mangled
/// name; [`BROKEN`] must fail with NVRTC's log. Returns how many kernels were found.
pub fn check_kernels(cache: &CudaCache, context: Option<Context>) -> kcache::Result<usize> {
    let fail = |what: String| Error::Backend(what);
    let dir = tempfile::tempdir().map_err(|e| fail(e.to_string()))?;
    std::fs::write(dir.path().join("scale.h"), header("from_file"))
        .map_err(|e| fail(e.to_string()))?;
    let include = format!("-I{}", dir.path().display());
    let found = |lease: kcache::backend::cuda::ModuleLease, name: &str| {
        if lease.function(name)?.is_null() {
            return Err(fail(format!("{name}: a null CUfunction")));
        }
        Ok(())
    };
    found(
        cache.find_or_build_source(context, WITH_HEADER, &[&include], &[])?,
        "from_file",
    )?;
    let factor = [("factor.h", "#define FACTOR 3.0f\n")];
    found(
        cache.find_or_build_source_with_headers(context, WITH_BOTH, &factor, &[&include], &[])?,
        "from_file",
    )?;
    found(
        cache.find_or_build_source(context, TEMPLATE, &["-std=c++17"], &[])?,
        TEMPLATE_FLOAT,
    )?;
    match cache.find_or_build_source(context, BROKEN, &[], &[]) {
        Err(Error::Build(e)) if e.message.contains("missing_name") => Ok(3),
        other => Err(fail(format!(
            "a failing compile gave {:?}, not NVRTC's log",
            other.err()
        ))),
    }
}
