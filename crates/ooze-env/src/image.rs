//! Root filesystems built from Debian packages, once, and cached by the hash of what they hold.
//!
//! An [`ImageSpec`] names a Debian suite, packages and setup commands (TOML: `suite`, `mirror`,
//! `packages`, `setup`). [`ImageCache::build`] runs Debian's `mmdebstrap` (variant `essential`:
//! dpkg, bash, coreutils and the other Essential packages, plus the ones named) into a hidden
//! directory beside the cache entry, runs each setup command chrooted in it, writes
//! `image.json` and renames the directory into place: a crash leaves a `.partial` directory that
//! the next build removes, never a half image. Builders of one hash (threads or processes) take a
//! lock file in turn; the second finds the first's image.
//!
//! The cache key is SHA-256 of the canonical spec (suite, mirror, sorted packages, setup commands
//! in order, and the layout version), so changing any of them builds a new image and nothing else
//! does. Documentation, manual pages and translations are left out of images (dpkg
//! `path-exclude`): they are most of a small image's size and nothing an agent needs offline.
//!
//! Without a `mirror` mmdebstrap reads the host's apt sources, so a machine with a local mirror
//! (or an apt proxy) builds offline.

use crate::error::EnvError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Bumped when the image layout or the build flags change.
const LAYOUT: &str = "ooze-image-v1";

/// What an image holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// Debian suite (`bookworm`, `trixie`, `stable`).
    #[serde(default = "default_suite")]
    pub suite: String,
    /// Debian mirror URL; empty: the host's apt sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    /// Packages beyond Essential (which has bash, coreutils, grep, sed, tar, gzip, findutils).
    #[serde(default)]
    pub packages: Vec<String>,
    /// Shell commands run in order, chrooted in the image, as root, after the packages.
    #[serde(default)]
    pub setup: Vec<String>,
}

fn default_suite() -> String {
    "bookworm".into()
}

impl ImageSpec {
    /// The spec in a TOML file, with errors naming the file and the key.
    pub fn load(path: &Path) -> Result<ImageSpec, EnvError> {
        let text = std::fs::read_to_string(path)
            .map_err(EnvError::io(format!("reading {}", path.display())))?;
        ImageSpec::parse(&text).map_err(|message| EnvError::Spec {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses and checks a spec's TOML text.
    pub fn parse(text: &str) -> Result<ImageSpec, String> {
        let spec: ImageSpec = toml::from_str(text).map_err(|e| e.to_string())?;
        spec.check()?;
        Ok(spec)
    }

    /// Names Debian would refuse, caught before a build starts.
    pub fn check(&self) -> Result<(), String> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.:=~".contains(c))
        };
        if !name_ok(&self.suite) {
            return Err(format!(
                "suite {:?} is not a Debian suite name (such as \"bookworm\")",
                self.suite
            ));
        }
        if let Some(bad) = self.packages.iter().find(|p| !name_ok(p)) {
            return Err(format!(
                "packages: {bad:?} is not a Debian package name (lower case, digits, + - . : = ~)"
            ));
        }
        if let Some(i) = self.setup.iter().position(|c| c.contains('\0')) {
            return Err(format!("setup[{i}] contains a NUL byte"));
        }
        Ok(())
    }

    /// The cache key: SHA-256 of the canonical spec, hex, first 20 characters.
    pub fn hash(&self) -> String {
        let mut packages = self.packages.clone();
        packages.sort();
        packages.dedup();
        let mut h = Sha256::new();
        h.update(LAYOUT);
        h.update(format!("\0suite={}", self.suite));
        h.update(format!("\0mirror={}", self.mirror.as_deref().unwrap_or("")));
        for p in &packages {
            h.update(format!("\0package={p}"));
        }
        for s in &self.setup {
            h.update(format!("\0setup={}:{s}", s.len()));
        }
        h.finalize()[..10]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// A built image: `DIR/rootfs` and `DIR/image.json`.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub info: ImageInfo,
}

/// `image.json`: what was built, when and how big.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageInfo {
    pub hash: String,
    pub spec: ImageSpec,
    pub bytes: u64,
    pub build_seconds: f64,
    pub built_at: String,
}

impl Image {
    /// The image in `dir` (as printed by `ooze env build`).
    pub fn open(dir: &Path) -> Result<Image, EnvError> {
        let info_path = dir.join("image.json");
        let text = std::fs::read_to_string(&info_path)
            .map_err(|_| EnvError::NotAnImage(dir.to_owned()))?;
        if !dir.join("rootfs").is_dir() {
            return Err(EnvError::NotAnImage(dir.to_owned()));
        }
        let info = serde_json::from_str(&text).map_err(|e| EnvError::Spec {
            path: info_path,
            message: e.to_string(),
        })?;
        Ok(Image {
            dir: dir.to_owned(),
            info,
        })
    }

    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
}

/// Where images are kept: `$OOZE_IMAGE_CACHE`, else `$XDG_CACHE_HOME/ooze/images`, else
/// `~/.cache/ooze/images`.
#[derive(Debug, Clone)]
pub struct ImageCache {
    pub root: PathBuf,
}

impl Default for ImageCache {
    fn default() -> Self {
        let root = std::env::var_os("OOZE_IMAGE_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ooze/images"))
            })
            .or_else(|| {
                std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/ooze/images"))
            })
            .unwrap_or_else(|| std::env::temp_dir().join("ooze-images"));
        ImageCache { root }
    }
}

impl ImageCache {
    pub fn new(root: impl Into<PathBuf>) -> ImageCache {
        ImageCache { root: root.into() }
    }

    /// The cached image of `spec`, if built.
    pub fn find(&self, spec: &ImageSpec) -> Option<Image> {
        Image::open(&self.root.join(spec.hash())).ok()
    }

    /// The image of `spec`, built now if the cache does not have it. mmdebstrap's progress goes to
    /// stderr, each line prefixed with the hash.
    pub fn build(&self, spec: &ImageSpec) -> Result<Image, EnvError> {
        let hash = spec.hash();
        let build_err = |message: String| EnvError::Build {
            hash: hash.clone(),
            message,
        };
        spec.check().map_err(&build_err)?;
        if let Some(image) = self.find(spec) {
            return Ok(image);
        }
        std::fs::create_dir_all(&self.root)
            .map_err(EnvError::io(format!("creating {}", self.root.display())))?;
        let _lock = FileLock::take(&self.root.join(format!(".{hash}.lock")))?;
        // Another builder may have finished while this one waited.
        if let Some(image) = self.find(spec) {
            return Ok(image);
        }
        let which = |tool: &str, package: &str| {
            if find_program(tool).is_none() {
                Err(EnvError::Missing {
                    missing: format!("`{tool}` is not installed"),
                    fix: format!("install it with `apt-get install {package}`"),
                })
            } else {
                Ok(())
            }
        };
        which("mmdebstrap", "mmdebstrap")?;
        let partial = self.root.join(format!(".{hash}.partial"));
        if partial.exists() {
            std::fs::remove_dir_all(&partial)
                .map_err(EnvError::io(format!("removing {}", partial.display())))?;
        }
        std::fs::create_dir_all(&partial)
            .map_err(EnvError::io(format!("creating {}", partial.display())))?;
        let started = Instant::now();
        if let Err(message) = run_mmdebstrap(spec, &partial.join("rootfs"), &hash) {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(build_err(message));
        }
        let info = ImageInfo {
            hash: hash.clone(),
            spec: spec.clone(),
            bytes: tree_bytes(&partial.join("rootfs")),
            build_seconds: started.elapsed().as_secs_f64(),
            built_at: now_utc(),
        };
        let json = serde_json::to_vec_pretty(&info).expect("invariant: plain data serializes");
        ooze_core::atomic_file::write(&partial.join("image.json"), &json)
            .map_err(|e| build_err(e.to_string()))?;
        let dir = self.root.join(&hash);
        ooze_core::atomic_file::rename(&partial, &dir).map_err(|e| build_err(e.to_string()))?;
        Ok(Image { dir, info })
    }
}

fn run_mmdebstrap(spec: &ImageSpec, rootfs: &Path, hash: &str) -> Result<(), String> {
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg("--variant=essential")
        .arg(format!("--mode={}", if root { "root" } else { "unshare" }))
        .arg("--verbose");
    if !spec.packages.is_empty() {
        cmd.arg(format!("--include={}", spec.packages.join(",")));
    }
    for excluded in [
        "/usr/share/doc/*",
        "/usr/share/man/*",
        "/usr/share/info/*",
        "/usr/share/locale/*",
    ] {
        cmd.arg(format!("--dpkgopt=path-exclude={excluded}"));
    }
    for setup in &spec.setup {
        cmd.arg(format!(
            "--customize-hook=chroot \"$1\" /bin/sh -ec {}",
            shell_quote(setup)
        ));
    }
    // Apt's lists and caches are of no use offline.
    cmd.arg("--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*");
    cmd.arg(&spec.suite).arg(rootfs);
    if let Some(mirror) = &spec.mirror {
        cmd.arg(mirror);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting mmdebstrap: {e}"))?;
    let stdout = child.stdout.take().expect("invariant: piped");
    let stderr = child.stderr.take().expect("invariant: piped");
    let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let relay = |pipe: Box<dyn std::io::Read + Send>| {
        let (tail, hash) = (tail.clone(), hash.to_owned());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("[image {hash}] {line}");
                let mut tail = tail.lock().expect("not poisoned");
                tail.push_back(line);
                if tail.len() > 20 {
                    tail.pop_front();
                }
            }
        })
    };
    let threads = [relay(Box::new(stdout)), relay(Box::new(stderr))];
    let status = child
        .wait()
        .map_err(|e| format!("waiting for mmdebstrap: {e}"))?;
    for t in threads {
        let _ = t.join();
    }
    if status.success() {
        Ok(())
    } else {
        let tail = tail.lock().expect("not poisoned");
        Err(format!(
            "mmdebstrap failed ({status}); its last lines:\n{}",
            tail.iter().cloned().collect::<Vec<_>>().join("\n")
        ))
    }
}

/// `s` as one single-quoted shell word.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Bytes of regular files under `dir` (hard links once), without following symlinks.
fn tree_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                total += meta.len();
            }
        }
    }
    total
}

fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{secs}")
}

/// `name` on the PATH (or an absolute path that exists).
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).exists().then(|| PathBuf::from(name));
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// An exclusive `flock` on a file (created if missing), released on drop: held across processes,
/// and by the kernel only while the holder lives.
pub struct FileLock(std::fs::File);

impl FileLock {
    /// Waits for the lock on `path`.
    pub fn take(path: &Path) -> Result<FileLock, EnvError> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(EnvError::io(format!("opening lock {}", path.display())))?;
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(EnvError::Io {
                what: format!("locking {}", path.display()),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(FileLock(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_follows_the_contents_not_the_order_of_packages() {
        let a = ImageSpec::parse("packages = [\"git\", \"python3\"]").unwrap();
        let b = ImageSpec::parse("packages = [\"python3\", \"git\", \"git\"]").unwrap();
        assert_eq!(a.hash(), b.hash());
        let c = ImageSpec::parse("packages = [\"python3\", \"git\"]\nsetup = [\"true\"]").unwrap();
        assert_ne!(a.hash(), c.hash());
        let d = ImageSpec::parse("suite = \"trixie\"\npackages = [\"git\", \"python3\"]").unwrap();
        assert_ne!(a.hash(), d.hash());
        // Two setup commands are not one command with the same text joined.
        let e = ImageSpec::parse("setup = [\"a\", \"b\"]").unwrap();
        let f = ImageSpec::parse("setup = [\"a\\u0000setup=1:b\"]");
        assert!(f.is_err(), "a NUL in a setup command is refused");
        assert_ne!(
            e.hash(),
            ImageSpec::parse("setup = [\"ab\"]").unwrap().hash()
        );
    }

    #[test]
    fn bad_specs_name_the_key() {
        let err = ImageSpec::parse("packages = [\"Python3\"]").unwrap_err();
        assert!(err.contains("packages") && err.contains("Python3"), "{err}");
        let err = ImageSpec::parse("pakages = [\"git\"]").unwrap_err();
        assert!(err.contains("pakages"), "{err}");
        let err = ImageSpec::parse("suite = \"Book worm\"").unwrap_err();
        assert!(err.contains("suite"), "{err}");
    }

    #[test]
    fn a_directory_without_image_json_is_not_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let err = Image::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ooze env build"), "{err}");
    }
}
