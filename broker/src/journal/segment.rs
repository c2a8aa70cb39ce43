//! Segment files: naming and the 32-byte segment header (see `docs/journal-format.md`).

use std::path::{Path, PathBuf};

/// Bytes at the start of every segment; records follow.
pub(crate) const HEADER_LEN: u64 = 32;
const MAGIC: &[u8; 8] = b"MQJOURNL";
/// On-disk format version written by this code. Version 2 adds the write-start flag (bit 31
/// of a record's length word, see `record.rs`); version 3 the `Rekey` op (`op.rs`), which
/// only version 3 segments may hold (an older broker refuses them instead of misreading it).
/// This code reads versions 1 to 3.
pub(crate) const FORMAT_VERSION: u32 = 3;
/// Oldest format version whose segments may hold a `Rekey` op.
pub(crate) const REKEY_VERSION: u32 = 3;
/// Oldest format version this code reads.
pub(crate) const OLDEST_READABLE_VERSION: u32 = 1;

/// `00000000000000000042.seg`: twenty digits so names sort like numbers.
pub fn segment_file_name(segment: u64) -> String {
    format!("{segment:020}.seg")
}

/// The inverse of [`segment_file_name`]; `None` for any other file name.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(crate) fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(segment_file_name(segment))
}

pub(crate) fn encode_header(segment: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    h[16..24].copy_from_slice(&segment.to_le_bytes());
    // 24..28 reserved, zero.
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks a segment header; `Ok` is its format version, `Err` says what is wrong with it.
pub(crate) fn check_header(buf: &[u8], segment: u64) -> Result<u32, String> {
    if buf.len() < HEADER_LEN as usize {
        return Err(format!(
            "file is {} bytes, shorter than the segment header",
            buf.len()
        ));
    }
    let h = &buf[..HEADER_LEN as usize];
    let crc = u32::from_le_bytes(h[28..32].try_into().unwrap());
    if crc32c::crc32c(&h[0..28]) != crc {
        return Err("segment header CRC mismatch".into());
    }
    if &h[0..8] != MAGIC {
        return Err("not a journal segment (bad magic)".into());
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(format!(
            "segment format version {version}, this build reads versions \
             {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}: open it with a matching broker version"
        ));
    }
    let hl = u32::from_le_bytes(h[12..16].try_into().unwrap());
    if hl as u64 != HEADER_LEN {
        return Err(format!("unexpected header length {hl}"));
    }
    let n = u64::from_le_bytes(h[16..24].try_into().unwrap());
    if n != segment {
        return Err(format!("header says segment {n}, file name says {segment}"));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_file_name(42), "00000000000000000042.seg");
        assert_eq!(
            parse_segment_file_name("00000000000000000042.seg"),
            Some(42)
        );
        assert_eq!(parse_segment_file_name("42.seg"), None);
        assert_eq!(parse_segment_file_name("0000000000000000004x.seg"), None);
    }

    #[test]
    fn header_round_trip_and_rejects() {
        let h = encode_header(7);
        assert!(check_header(&h, 7).is_ok());
        assert!(check_header(&h, 8).is_err());
        let mut bad = h;
        bad[3] ^= 1;
        assert!(check_header(&bad, 7).is_err());
        assert!(check_header(&[0u8; 32], 7).is_err());
        assert!(check_header(&h[..10], 7).is_err());
    }
}
