//! The `VkPipelineCacheHeaderVersionOne` check that stands between the disk and the driver.
//!
//! Drivers trust `pInitialData` of `vkCreatePipelineCache` far more than they should; several
//! have crashed on a blob from another GPU or another driver build. kcache therefore never hands
//! over a blob whose header does not name the live device exactly.

use std::fmt;

/// Size of `VkPipelineCacheHeaderVersionOne`.
pub const HEADER_LEN: usize = 32;
const HEADER_VERSION_ONE: u32 = 1;

/// What identifies a device's pipeline-cache data: the fields of the cache header plus the
/// driver version, which the header omits but which decides whether the driver can reuse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheIdentity {
    pub vendor_id: u32,
    pub device_id: u32,
    pub driver_version: u32,
    pub pipeline_cache_uuid: [u8; 16],
}

/// Why a blob was not handed to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderMismatch {
    TooShort(usize),
    HeaderLength(u32),
    HeaderVersion(u32),
    Vendor(u32),
    Device(u32),
    Uuid,
}

impl fmt::Display for HeaderMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort(n) => {
                write!(f, "{n} bytes is shorter than the {HEADER_LEN}-byte header")
            }
            Self::HeaderLength(n) => write!(f, "header length field {n} is out of range"),
            Self::HeaderVersion(v) => write!(f, "header version {v} is not VERSION_ONE"),
            Self::Vendor(v) => write!(f, "vendor id {v:#x} is not the device's"),
            Self::Device(d) => write!(f, "device id {d:#x} is not the device's"),
            Self::Uuid => write!(f, "pipelineCacheUUID is not the device's"),
        }
    }
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Accepts `data` only if its header is version one, self-consistent, and names `device`.
/// The spec fixes the header's byte order as little-endian regardless of the host.
pub fn check(data: &[u8], device: &CacheIdentity) -> Result<(), HeaderMismatch> {
    if data.len() < HEADER_LEN {
        return Err(HeaderMismatch::TooShort(data.len()));
    }
    let header_len = le32(data, 0);
    if (header_len as usize) < HEADER_LEN || header_len as usize > data.len() {
        return Err(HeaderMismatch::HeaderLength(header_len));
    }
    let version = le32(data, 4);
    if version != HEADER_VERSION_ONE {
        return Err(HeaderMismatch::HeaderVersion(version));
    }
    let vendor = le32(data, 8);
    if vendor != device.vendor_id {
        return Err(HeaderMismatch::Vendor(vendor));
    }
    let device_id = le32(data, 12);
    if device_id != device.device_id {
        return Err(HeaderMismatch::Device(device_id));
    }
    if data[16..32] != device.pipeline_cache_uuid {
        return Err(HeaderMismatch::Uuid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: CacheIdentity = CacheIdentity {
        vendor_id: 0x10005,
        device_id: 7,
        driver_version: 1,
        pipeline_cache_uuid: [9; 16],
    };

    fn header() -> Vec<u8> {
        // Header length, header version, vendor and device, then the pipeline-cache UUID.
        let words = [32u32, 1, DEV.vendor_id, DEV.device_id];
        let mut h: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        h.extend_from_slice(&DEV.pipeline_cache_uuid);
        h
    }

    #[test]
    fn accepts_own_header_with_payload() {
        let mut h = header();
        check(&h, &DEV).unwrap();
        h.extend_from_slice(b"driver payload");
        check(&h, &DEV).unwrap();
    }

    #[test]
    fn rejects_each_mismatching_field() {
        assert_eq!(
            check(&header()[..31], &DEV),
            Err(HeaderMismatch::TooShort(31))
        );
        let cases: [(usize, u8, HeaderMismatch); 5] = [
            (0, 40, HeaderMismatch::HeaderLength(40)),
            (4, 2, HeaderMismatch::HeaderVersion(2)),
            (8, 6, HeaderMismatch::Vendor(0x10006)),
            (12, 8, HeaderMismatch::Device(8)),
            (20, 0, HeaderMismatch::Uuid),
        ];
        for (at, byte, want) in cases {
            let mut h = header();
            h[at] = byte;
            assert_eq!(check(&h, &DEV), Err(want));
        }
        let mut short_len = header();
        short_len[0] = 16;
        assert_eq!(
            check(&short_len, &DEV),
            Err(HeaderMismatch::HeaderLength(16))
        );
    }
}
