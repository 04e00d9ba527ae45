//! Files and directories replaced whole, so a crash or a full disk never leaves a torn one.
//!
//! [`write`] puts the bytes in a temporary sibling `.NAME.tmp.<pid>.<n>` (same directory, so the
//! same filesystem and an atomic rename), flushes it to disk (`sync_all`), renames it over the
//! target and then flushes the directory, so the rename itself survives a power cut. Readers see
//! the old contents or the new, never a mix. On failure the temporary is removed and the target is
//! left as it was. `n` comes from a process-wide counter and the temporary is created exclusively,
//! so concurrent writers of one path (threads or processes) never share a temporary: each rename
//! is whole and the last one wins.
//!
//! [`rename`] moves a finished directory (a checkpoint built under a hidden name) into place and
//! flushes the parent directory the same way.
//!
//! Errors say what was being done and to which path (`writing PATH`, `renaming A to B`) and keep
//! the OS error as their [`source`](std::error::Error::source), printed once by an error chain.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file or directory that could not be replaced.
#[derive(Debug, thiserror::Error)]
pub enum AtomicFileError {
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("renaming {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("syncing directory {dir}")]
    SyncDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Distinguishes the temporaries of one process (a name generator; it holds no other state).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a fresh temporary next to `path`; never opens one that exists.
fn create_temp(path: &Path) -> std::io::Result<(PathBuf, File)> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidInput, "the path has no file name"))?;
    let dir = parent_dir(path);
    loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".tmp.{}.{n}", std::process::id()));
        let tmp = dir.join(temp_name);
        match File::options().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            // Left by a crashed process whose pid was reused: take the next number.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Replaces `path` with `bytes` (see the module docs).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), AtomicFileError> {
    write_with(path, |file| file.write_all(bytes))
}

/// Replaces `path` with what `fill` writes into the (empty) temporary file.
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), AtomicFileError> {
    let write_error = |source| AtomicFileError::Write {
        path: path.to_owned(),
        source,
    };
    let (tmp, mut file) = create_temp(path).map_err(write_error)?;
    let written = fill(&mut file).and_then(|()| file.sync_all());
    drop(file);
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(write_error(source));
    }
    if let Err(source) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(AtomicFileError::Rename {
            from: tmp,
            to: path.to_owned(),
            source,
        });
    }
    sync_dir(parent_dir(path))
}

/// Renames `from` to `to` (a file or a finished directory) and flushes the directories involved,
/// so the new name survives a crash.
pub fn rename(from: &Path, to: &Path) -> Result<(), AtomicFileError> {
    std::fs::rename(from, to).map_err(|source| AtomicFileError::Rename {
        from: from.to_owned(),
        to: to.to_owned(),
        source,
    })?;
    let (old_dir, new_dir) = (parent_dir(from), parent_dir(to));
    sync_dir(new_dir)?;
    if old_dir != new_dir {
        sync_dir(old_dir)?;
    }
    Ok(())
}

/// Flushes `dir`'s entries (created, renamed or removed names) to disk. Filesystems that cannot
/// sync a directory (they answer EINVAL or "unsupported") are left as they are.
pub fn sync_dir(dir: &Path) -> Result<(), AtomicFileError> {
    #[cfg(unix)]
    {
        let synced = File::open(dir).and_then(|d| d.sync_all());
        match synced {
            Err(e) if !matches!(e.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported) => {
                return Err(AtomicFileError::SyncDir {
                    dir: dir.to_owned(),
                    source: e,
                })
            }
            _ => {}
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// A fresh empty directory under the system temp dir (ooze-core has no tempfile dependency).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ooze-atomic-file-{name}-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The error and its causes as `anyhow`'s `{:#}` prints them.
    fn chain(e: &dyn Error) -> String {
        let mut parts = vec![e.to_string()];
        let mut cause = e.source();
        while let Some(c) = cause {
            parts.push(c.to_string());
            cause = c.source();
        }
        parts.join(": ")
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = scratch("replace");
        let path = dir.join("state.json");
        write(&path, b"old").unwrap();
        write(&path, b"new contents").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        assert_eq!(entries(&dir), vec!["state.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_writers_of_one_path_both_succeed_and_one_wins_whole() {
        let dir = scratch("concurrent");
        let path = dir.join("latest");
        let contents = [vec![b'a'; 256 * 1024], vec![b'b'; 256 * 1024]];
        for _ in 0..20 {
            std::thread::scope(|s| {
                let writers: Vec<_> = contents
                    .iter()
                    .map(|c| {
                        let path = &path;
                        s.spawn(move || (0..5).try_for_each(|_| write(path, c)))
                    })
                    .collect();
                for w in writers {
                    w.join().unwrap().unwrap();
                }
            });
            let now = std::fs::read(&path).unwrap();
            assert!(
                contents.contains(&now),
                "a torn file of {} bytes",
                now.len()
            );
        }
        assert_eq!(entries(&dir), vec!["latest"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[cfg(target_os = "linux")] // /dev/full
    fn a_full_disk_is_reported_as_writing_the_path_with_its_cause_once() {
        let dir = scratch("full");
        let path = dir.join("metrics.jsonl");
        write(&path, b"kept").unwrap();
        // /dev/full answers every write with ENOSPC, as a full filesystem does.
        let err = write_with(&path, |_| {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")?
                .write_all(b"more")
        })
        .unwrap_err();
        let text = chain(&err);
        assert!(
            text.starts_with(&format!("writing {}: ", path.display())),
            "{text}"
        );
        let cause = std::io::Error::from_raw_os_error(28).to_string();
        assert_eq!(text.matches(&cause).count(), 1, "{text}");
        assert!(!text.contains("read"), "{text}");
        // The target is untouched and the temporary is gone.
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
        assert_eq!(entries(&dir), vec!["metrics.jsonl"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_a_write_error_naming_the_target() {
        let dir = scratch("missing");
        let path = dir.join("no-such-dir").join("latest");
        let err = write(&path, b"x").unwrap_err();
        assert!(matches!(err, AtomicFileError::Write { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("writing {}", path.display()));
        let AtomicFileError::Write { source, .. } = &err else {
            unreachable!()
        };
        assert_eq!(source.kind(), ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rename_moves_a_finished_directory_into_place() {
        let dir = scratch("rename");
        let partial = dir.join(".checkpoint-000001.partial");
        std::fs::create_dir(&partial).unwrap();
        write(&partial.join("trainer_state.json"), b"{}").unwrap();
        let done = dir.join("checkpoint-000001");
        rename(&partial, &done).unwrap();
        assert_eq!(entries(&dir), vec!["checkpoint-000001"]);
        assert_eq!(
            std::fs::read(done.join("trainer_state.json")).unwrap(),
            b"{}"
        );
        let err = rename(&partial, &done).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("renaming {} to {}", partial.display(), done.display())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
