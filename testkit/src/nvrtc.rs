//! NVIDIA's own NVRTC, from the package registry (PyPI's `nvidia-cuda-nvrtc` for CUDA 13 and
//! `nvidia-cuda-nvrtc-cu12` for CUDA 12), which compiles CUDA C++ on any x86-64 machine, GPU or
//! not: `scripts/test` installs both into the target directory and names the libraries in
//! [`NVRTC13`] and [`NVRTC12`]. And what tells NVIDIA's output apart: a cubin is an ELF of
//! `EM_CUDA` for one architecture.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use kcache::backend::cuda::Nvrtc;

use crate::needs::{self, Missing};

/// The variable naming CUDA 13's `libnvrtc.so.13`.
pub const NVRTC13: &str = "KCACHE_TEST_NVRTC13";
/// The variable naming CUDA 12's `libnvrtc.so.12`.
pub const NVRTC12: &str = "KCACHE_TEST_NVRTC12";

/// Set by `scripts/test`, to why, where PyPI cannot be reached: the tests are skipped even
/// under [`needs::REQUIRE_ALL`], as nothing on the machine could have installed NVRTC.
pub const UNREACHABLE: &str = "KCACHE_TEST_NVRTC_UNREACHABLE";

/// The NVRTC library the variable `var` ([`NVRTC13`], [`NVRTC12`]) names, loaded; `None` once
/// the test is said to be skipped when it names none (see [`needs`]).
pub fn real_nvrtc(var: &str) -> Option<Arc<Nvrtc>> {
    if let Some(why) = std::env::var_os(UNREACHABLE) {
        // One write to the standard error itself, as needs::met says a skip.
        let line = format!(
            "skipped: NVIDIA's NVRTC is not installed: {}\n",
            why.display()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
        return None;
    }
    let install = format!(
        "scripts/test installs it from PyPI (nvidia-cuda-nvrtc, nvidia-cuda-nvrtc-cu12) and sets \
         {var} to its libnvrtc.so"
    );
    let path = needs::met(
        std::env::var_os(var)
            .map(PathBuf::from)
            .ok_or_else(|| Missing::new(format!("{var} is not set"), install.clone()))
            .and_then(|path| needs::file(path, &install)),
    )?;
    Some(Arc::new(Nvrtc::load_from(&path).unwrap()))
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
