//! TensorBoard event files, written directly: TFRecord framing (length, masked CRC-32C of the
//! length, the record, masked CRC-32C of the record) around `Event` protocol buffers holding scalar
//! summaries. The first record carries the file version, as TensorFlow's writer does.

use std::io::Write;
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli), bitwise.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, ((field << 3) | 2) as u64);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `Event { wall_time, step, summary { value { tag, simple_value } … } }`.
fn scalar_event(wall_time: f64, step: i64, scalars: &[(String, f32)]) -> Vec<u8> {
    let mut summary = Vec::new();
    for (tag, value) in scalars {
        let mut v = Vec::new();
        bytes_field(&mut v, 1, tag.as_bytes());
        v.push((2 << 3) | 5);
        v.extend_from_slice(&value.to_le_bytes());
        bytes_field(&mut summary, 1, &v);
    }
    let mut event = vec![1 << 3 | 1];
    event.extend_from_slice(&wall_time.to_le_bytes());
    event.push(2 << 3);
    varint(&mut event, step as u64);
    bytes_field(&mut event, 5, &summary);
    event
}

fn version_event(wall_time: f64) -> Vec<u8> {
    let mut event = vec![1 << 3 | 1];
    event.extend_from_slice(&wall_time.to_le_bytes());
    bytes_field(&mut event, 3, b"brain.Event:2");
    event
}

fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// An open event file.
pub struct EventWriter {
    file: std::fs::File,
    pub path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (created if needed).
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "ooze".into());
        let wall = now();
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}",
            wall as u64,
            std::process::id()
        ));
        let mut file = std::fs::File::create(&path)?;
        file.write_all(&record(&version_event(wall)))?;
        Ok(EventWriter { file, path })
    }

    /// Writes the scalars of one step and flushes.
    pub fn scalars(&mut self, step: i64, scalars: &[(String, f32)]) -> std::io::Result<()> {
        if scalars.is_empty() {
            return Ok(());
        }
        self.file
            .write_all(&record(&scalar_event(now(), step, scalars)))?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_value() {
        // The CRC-32C check value (RFC 3720's test vector "123456789").
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    #[test]
    fn records_frame_and_check() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(3, &[("reward/mean".into(), 0.5)]).unwrap();
        let bytes = std::fs::read(&w.path).unwrap();
        // Walk the records, checking both CRCs.
        let mut at = 0;
        let mut records = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(len_crc, masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            records.push(data.to_vec());
            at += 16 + len;
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].ends_with(b"brain.Event:2"));
        let tag = b"reward/mean";
        assert!(records[1].windows(tag.len()).any(|w| w == tag));
        assert!(records[1].windows(4).any(|w| w == 0.5f32.to_le_bytes()));
    }
}
