//! The Vulkan pipeline-cache header check on hostile blobs.
//!
//! The blob comes from the disk tier and goes to `vkCreatePipelineCache`, which several drivers
//! have crashed on when it was another device's. `check_cache_header` is the only thing in
//! between, so the target holds it to the `VkPipelineCacheHeaderVersionOne` layout: it accepts a
//! blob exactly when the header length is in range, the version is ONE and vendor, device and
//! UUID are the device's, and a refusal names the first field that differs, in the documented
//! order.
//!
//! The device identity is taken from the input: by default from the blob's own header (so that
//! acceptance is reachable), then altered field by field as the first input byte says.
#![no_main]

use kcache::backend::vulkan::{CacheIdentity, HEADER_LEN, HeaderMismatch, check_cache_header};
use libfuzzer_sys::fuzz_target;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The expected outcome, from the header layout: length, version, vendorID, deviceID,
/// pipelineCacheUUID, all little-endian, checked in that order.
fn expected(data: &[u8], device: &CacheIdentity) -> Result<(), HeaderMismatch> {
    if data.len() < 32 {
        return Err(HeaderMismatch::TooShort(data.len()));
    }
    let len = le32(data, 0);
    if len < 32 || u64::from(len) > data.len() as u64 {
        return Err(HeaderMismatch::HeaderLength(len));
    }
    if le32(data, 4) != 1 {
        return Err(HeaderMismatch::HeaderVersion(le32(data, 4)));
    }
    if le32(data, 8) != device.vendor_id {
        return Err(HeaderMismatch::Vendor(le32(data, 8)));
    }
    if le32(data, 12) != device.device_id {
        return Err(HeaderMismatch::Device(le32(data, 12)));
    }
    if data[16..32] != device.pipeline_cache_uuid {
        return Err(HeaderMismatch::Uuid);
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    assert_eq!(
        HEADER_LEN, 32,
        "VkPipelineCacheHeaderVersionOne is 32 bytes"
    );
    let Some((&mode, blob)) = data.split_first() else {
        return;
    };
    let mut device = CacheIdentity {
        vendor_id: 0x10005,
        device_id: 0,
        driver_version: 1,
        pipeline_cache_uuid: [0; 16],
    };
    if blob.len() >= 32 {
        device.vendor_id = le32(blob, 8);
        device.device_id = le32(blob, 12);
        device.pipeline_cache_uuid.copy_from_slice(&blob[16..32]);
    }
    // Each low bit of the mode byte makes one field of the device differ from the blob's.
    if mode & 1 != 0 {
        device.vendor_id ^= 1;
    }
    if mode & 2 != 0 {
        device.device_id = device.device_id.wrapping_add(1);
    }
    if mode & 4 != 0 {
        device.pipeline_cache_uuid[usize::from(mode >> 4)] ^= 0x80;
    }
    if mode & 8 != 0 {
        // The driver version is not in the header: it must not change the outcome.
        device.driver_version = device.driver_version.wrapping_add(u32::from(mode));
    }

    let got = check_cache_header(blob, &device);
    assert_eq!(got, expected(blob, &device), "blob of {} bytes", blob.len());
    if got.is_ok() {
        assert!(mode & 7 == 0, "accepted a blob naming another device");
    } else {
        // The message must render (it goes into logs and kc_last_error_message).
        assert!(!got.unwrap_err().to_string().is_empty());
    }
});
