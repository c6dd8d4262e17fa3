//! L2's on-disk format and its blocking file operations: one file per object, named from the
//! key's hex (injective, case-insensitive-safe, under the 255-byte name limit), holding a
//! checksummed header, the key and the body. Writes go to `tmp/` first, are fsync'd (when
//! asked) and renamed into place, so a crash never leaves a half object under a real name.
//!
//! Everything here blocks: callers run it on the blocking pool (`spawn_blocking`). The
//! policy (what to keep, what to evict) lives in `lru` and `tiers`, not here.

use crate::node::model::codec::{ObjectMeta, MAX_KEY_LEN};
use crate::node::model::compress::Codec;
use bytes::{Bytes, BytesMut};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

const MAGIC: &[u8; 8] = b"KVPLOBJ1";
/// Fixed header bytes before the key: magic, key length, the body's codec (0 = as PUT; a
/// `compress` command's codec otherwise), 7 × i32 of meta, body length, body CRC-32, header
/// CRC-32.
pub(crate) const FIXED_HEADER: usize = 8 + 2 + 2 + 28 + 8 + 4 + 4;
/// Object files end in this.
const EXT: &str = "kvo";
/// Hex characters of the key kept in the file name; the rest goes one directory down.
const NAME_SPLIT: usize = 200;
/// Sub-directory for writes in progress (emptied at start).
const TMP_DIR: &str = "tmp";
/// Sub-directory holding the objects.
const OBJ_DIR: &str = "objects";

/// Why an object file cannot be served.
#[derive(Debug, Error)]
pub(crate) enum DiskError {
    /// The file system failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The file is not a complete, intact object (torn, truncated or corrupt).
    #[error("corrupt object file: {0}")]
    Corrupt(&'static str),
}

impl DiskError {
    /// A metric label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            DiskError::Io(e) if e.kind() == io::ErrorKind::NotFound => "missing",
            DiskError::Io(_) => "io",
            DiskError::Corrupt(why) => why,
        }
    }
}

/// A decoded file header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileHeader {
    pub(crate) key: String,
    pub(crate) meta: ObjectMeta,
    pub(crate) body_len: u64,
    /// How the body is encoded.
    pub(crate) codec: Codec,
    body_crc: u32,
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The path of `key`'s object file under `root`: `objects/<hex>.kvo`, or for long keys
/// `objects/<hex[..200]>.d/<hex[200..]>.kvo` (distinct suffixes keep the mapping injective).
pub(crate) fn object_path(root: &Path, key: &str) -> PathBuf {
    let h = hex(key.as_bytes());
    let mut p = root.join(OBJ_DIR);
    if h.len() > NAME_SPLIT {
        p.push(format!("{}.d", &h[..NAME_SPLIT]));
        p.push(format!("{}.{EXT}", &h[NAME_SPLIT..]));
    } else {
        p.push(format!("{h}.{EXT}"));
    }
    p
}

/// Encodes the header for `key`, `meta` and `body`.
pub(crate) fn encode_header(key: &str, meta: &ObjectMeta, codec: Codec, body: &[u8]) -> Vec<u8> {
    let k = key.as_bytes();
    let mut h = Vec::with_capacity(FIXED_HEADER + k.len());
    h.extend_from_slice(MAGIC);
    // Keys are at most 150 bytes (the wire's field); the cast cannot truncate.
    h.extend_from_slice(&u16::try_from(k.len()).unwrap_or(u16::MAX).to_le_bytes());
    h.extend_from_slice(&codec.id().to_le_bytes());
    for v in [meta.fmt, meta.dtype, meta.location]
        .iter()
        .chain(meta.shape.iter())
    {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&(body.len() as u64).to_le_bytes());
    h.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    let header_crc = {
        let mut c = crc32fast::Hasher::new();
        c.update(&h);
        c.update(k);
        c.finalize()
    };
    h.extend_from_slice(&header_crc.to_le_bytes());
    h.extend_from_slice(k);
    h
}

fn le_i32(b: &[u8], at: usize) -> i32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    i32::from_le_bytes(w)
}

/// Decodes a header from the start of `buf` (which holds at least the fixed part and the
/// key). Returns the header and its total length.
pub(crate) fn decode_header(buf: &[u8]) -> Result<(FileHeader, usize), DiskError> {
    if buf.len() < FIXED_HEADER || &buf[..8] != MAGIC {
        return Err(DiskError::Corrupt("bad_magic"));
    }
    let key_len = usize::from(u16::from_le_bytes([buf[8], buf[9]]));
    if key_len == 0 || key_len > MAX_KEY_LEN || buf.len() < FIXED_HEADER + key_len {
        return Err(DiskError::Corrupt("bad_header"));
    }
    let codec = Codec::from_id(u16::from_le_bytes([buf[10], buf[11]]))
        .ok_or(DiskError::Corrupt("bad_header"))?;
    let ints: Vec<i32> = (0..7).map(|i| le_i32(buf, 12 + 4 * i)).collect();
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&buf[40..48]);
    let body_len = u64::from_le_bytes(len8);
    let mut crc4 = [0u8; 4];
    crc4.copy_from_slice(&buf[48..52]);
    let body_crc = u32::from_le_bytes(crc4);
    crc4.copy_from_slice(&buf[52..56]);
    let header_crc = u32::from_le_bytes(crc4);
    let key_bytes = &buf[FIXED_HEADER..FIXED_HEADER + key_len];
    let mut c = crc32fast::Hasher::new();
    c.update(&buf[..52]);
    c.update(key_bytes);
    if c.finalize() != header_crc {
        return Err(DiskError::Corrupt("bad_header"));
    }
    let key = std::str::from_utf8(key_bytes)
        .map_err(|_| DiskError::Corrupt("bad_header"))?
        .to_owned();
    let meta = ObjectMeta {
        fmt: ints[0],
        dtype: ints[1],
        location: ints[2],
        shape: [ints[3], ints[4], ints[5], ints[6]],
    };
    Ok((
        FileHeader {
            key,
            meta,
            body_len,
            codec,
            body_crc,
        },
        FIXED_HEADER + key_len,
    ))
}

/// The directories of an L2 root, created if missing; `tmp/` is emptied (writes that were in
/// progress at a crash are discarded). Returns how many temp files were removed.
pub(crate) fn prepare_root(root: &Path) -> io::Result<u64> {
    fs::create_dir_all(root.join(OBJ_DIR))?;
    let tmp = root.join(TMP_DIR);
    let mut removed = 0;
    if tmp.exists() {
        for entry in fs::read_dir(&tmp)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                fs::remove_file(entry.path())?;
                removed += 1;
            }
        }
    }
    fs::create_dir_all(&tmp)?;
    Ok(removed)
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes one object: temp file, optional fsync, rename into place, optional directory
/// fsync. Returns the bytes written to disk (header + body).
pub(crate) fn write_object(
    root: &Path,
    key: &str,
    meta: &ObjectMeta,
    codec: Codec,
    body: &[u8],
    fsync: bool,
) -> io::Result<u64> {
    let header = encode_header(key, meta, codec, body);
    replace_file(root, &object_path(root, key), &[&header, body], fsync)?;
    Ok((header.len() + body.len()) as u64)
}

/// Writes `parts` to `dest` without ever leaving it torn: a temp file under `tmp/`, optional
/// fsync, rename into place (creating its directory), optional fsync of the directory.
fn replace_file(root: &Path, dest: &Path, parts: &[&[u8]], fsync: bool) -> io::Result<()> {
    let tmp = root.join(TMP_DIR).join(format!(
        "{}-{}.tmp",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        for part in parts {
            f.write_all(part)?;
        }
        if fsync {
            f.sync_all()?;
        }
        drop(f);
        let dir = dest.parent().unwrap_or(root);
        fs::create_dir_all(dir)?;
        fs::rename(&tmp, dest)?;
        if fsync {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads and verifies `key`'s object: one buffer sized from the file, the body split off
/// without a copy.
pub(crate) fn read_object(root: &Path, key: &str) -> Result<(ObjectMeta, Codec, Bytes), DiskError> {
    let path = object_path(root, key);
    let mut f = File::open(&path)?;
    let size = usize::try_from(f.metadata()?.len()).map_err(|_| DiskError::Corrupt("size"))?;
    let mut buf = BytesMut::zeroed(size);
    f.read_exact(&mut buf)?;
    let (header, header_len) = decode_header(&buf)?;
    if header.key != key {
        return Err(DiskError::Corrupt("wrong_key"));
    }
    if (size - header_len) as u64 != header.body_len {
        return Err(DiskError::Corrupt("truncated"));
    }
    let body = buf.split_off(header_len).freeze();
    if crc32fast::hash(&body) != header.body_crc {
        return Err(DiskError::Corrupt("bad_checksum"));
    }
    Ok((header.meta, header.codec, body))
}

/// Deletes `key`'s object file (absent is fine).
pub(crate) fn delete_object(root: &Path, key: &str) -> io::Result<()> {
    match fs::remove_file(object_path(root, key)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The file listing L2's held keys (the controller's pins), one key's hex per line.
const PINS_FILE: &str = "pins";

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The keys held in L2 when the pins file was last written (none if it is absent; lines
/// that do not decode are skipped).
pub(crate) fn read_pins(root: &Path) -> io::Result<Vec<String>> {
    match fs::read_to_string(root.join(PINS_FILE)) {
        Ok(text) => Ok(text.lines().filter_map(unhex).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Replaces the pins file with `keys` (temp file, fsync, rename: never torn).
pub(crate) fn write_pins(root: &Path, keys: &[String], fsync: bool) -> io::Result<()> {
    let mut text = String::with_capacity(keys.iter().map(|k| 2 * k.len() + 1).sum());
    for k in keys {
        text.push_str(&hex(k.as_bytes()));
        text.push('\n');
    }
    replace_file(root, &root.join(PINS_FILE), &[text.as_bytes()], fsync)
}

/// An object found by [`scan`].
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) key: String,
    pub(crate) file_bytes: u64,
    /// Tokens the object holds (its header's shape, [`ObjectMeta::num_tokens`]).
    pub(crate) tokens: u32,
    pub(crate) modified: std::time::SystemTime,
}

/// What [`scan`] found: complete objects (oldest first) and how many files it discarded,
/// by reason.
#[derive(Debug, Default)]
pub(crate) struct ScanReport {
    pub(crate) found: Vec<Found>,
    pub(crate) discarded: Vec<(PathBuf, &'static str)>,
}

fn check_file(path: &Path, root: &Path) -> Result<Found, DiskError> {
    let mut f = File::open(path)?;
    let md = f.metadata()?;
    let mut head = vec![0u8; FIXED_HEADER + MAX_KEY_LEN];
    let mut filled = 0;
    while filled < head.len() {
        let n = f.read(&mut head[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    let (header, header_len) = decode_header(&head[..filled])?;
    if object_path(root, &header.key) != path {
        return Err(DiskError::Corrupt("wrong_key"));
    }
    if md.len() != header_len as u64 + header.body_len {
        return Err(DiskError::Corrupt("truncated"));
    }
    Ok(Found {
        tokens: header.meta.num_tokens(),
        key: header.key,
        file_bytes: md.len(),
        modified: md.modified()?,
    })
}

/// Scans `objects/` after [`prepare_root`]: every file whose header is intact and whose size
/// matches is found; anything else is deleted and reported. Bodies are not read here (their
/// checksum is verified on every read).
pub(crate) fn scan(root: &Path) -> io::Result<ScanReport> {
    let mut report = ScanReport::default();
    let mut dirs = vec![root.join(OBJ_DIR)];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                // Only the long-key split makes directories, and only one level deep.
                if dir == root.join(OBJ_DIR) {
                    dirs.push(path);
                }
                continue;
            }
            match check_file(&path, root) {
                Ok(found) => report.found.push(found),
                Err(e) => {
                    let _ = fs::remove_file(&path);
                    report.discarded.push((path, e.reason()));
                }
            }
        }
    }
    report.found.sort_by_key(|f| f.modified);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_file_round_trips_and_is_absent_at_first() {
        let root = std::env::temp_dir().join(format!("kvplane-pins-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        prepare_root(&root).expect("root");
        assert!(read_pins(&root).expect("absent is empty").is_empty());
        let keys = vec!["m@1@0@aa@bf16".to_owned(), "k\nwith newline".to_owned()];
        write_pins(&root, &keys, true).expect("write");
        assert_eq!(read_pins(&root).expect("read"), keys);
        write_pins(&root, &[], false).expect("write");
        assert!(read_pins(&root).expect("read").is_empty());
        let _ = fs::remove_dir_all(&root);
    }

    fn tempdir(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "kvplane-disk-{name}-{}-{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        p
    }

    const META: ObjectMeta = ObjectMeta {
        fmt: 1,
        dtype: 3,
        location: 0,
        shape: [2, 4, 8, 0],
    };

    #[test]
    fn write_read_scan_round_trip_including_long_and_odd_keys() {
        let root = tempdir("rt");
        prepare_root(&root).expect("root");
        let long = "k/é".repeat(37); // 148 bytes, slashes and non-ASCII
        for (key, body) in [("a/b", &b"hello"[..]), (long.as_str(), &[7u8; 1000][..])] {
            write_object(&root, key, &META, Codec::Raw, body, true).expect("write");
            let (meta, _, got) = read_object(&root, key).expect("read");
            assert_eq!((meta, &got[..]), (META, body));
        }
        assert!(object_path(&root, &long)
            .file_name()
            .is_some_and(|n| n.len() < 255));
        let report = scan(&root).expect("scan");
        let mut keys: Vec<_> = report.found.iter().map(|f| f.key.clone()).collect();
        keys.sort();
        assert_eq!(keys, vec!["a/b".to_owned(), long.clone()]);
        assert!(report.discarded.is_empty());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn torn_truncated_and_corrupt_files_are_discarded() {
        let root = tempdir("torn");
        prepare_root(&root).expect("root");
        write_object(&root, "good", &META, Codec::Raw, b"0123456789", false).expect("write");
        write_object(&root, "short", &META, Codec::Raw, b"0123456789", false).expect("write");
        write_object(&root, "flipped", &META, Codec::Raw, b"0123456789", false).expect("write");
        // Truncated body under a real name.
        let p = object_path(&root, "short");
        let len = fs::metadata(&p).expect("md").len();
        OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_len(len - 3))
            .expect("truncate");
        // A flipped body byte: the size is right, the checksum is not.
        let p = object_path(&root, "flipped");
        let mut raw = fs::read(&p).expect("read");
        let last = raw.len() - 1;
        raw[last] ^= 0xff;
        fs::write(&p, raw).expect("write");
        // Garbage under an object name, and a torn temp file.
        fs::write(object_path(&root, "junk"), b"not an object").expect("junk");
        fs::write(root.join(TMP_DIR).join("1-1.tmp"), b"KVPLOBJ1 half").expect("tmp");

        assert_eq!(prepare_root(&root).expect("again"), 1, "temp file removed");
        let report = scan(&root).expect("scan");
        let found: Vec<_> = report.found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&"good") && found.contains(&"flipped"));
        let mut reasons: Vec<_> = report.discarded.iter().map(|(_, r)| *r).collect();
        reasons.sort_unstable();
        assert_eq!(reasons, ["bad_magic", "truncated"]);
        assert!(!object_path(&root, "short").exists());
        // The flipped body is caught when read.
        let err = read_object(&root, "flipped").expect_err("corrupt");
        assert_eq!(err.reason(), "bad_checksum");
        assert_eq!(
            read_object(&root, "good").expect("ok").2,
            &b"0123456789"[..]
        );
        let _ = fs::remove_dir_all(&root);
    }
}
