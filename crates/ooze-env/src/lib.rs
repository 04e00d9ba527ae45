//! Environments for agents: containers built from Debian packages, episodes in them, and the
//! tasks that run there.
//!
//! - [`image`]: root filesystems built by `mmdebstrap` from a package list and setup commands,
//!   cached by content hash (`ooze env build`).
//! - [`sandbox`]: the one sandbox: probes what isolation the machine gives, starts episodes.
//! - [`episode`]: a persistent shell under bubblewrap with a per-episode writable layer, cgroup
//!   limits, per-command timeouts and capped output; files in and out.
//! - [`task`]: task directories in Harbor's layout, their loader and verifier.
//! - [`cgroup`], [`launch`] and [`files`]: the mechanics below those.
//! - [`spawn`]: programs started without `fork` (a hook before `exec`, the exit through a pidfd).

pub mod cgroup;
pub mod episode;
pub mod error;
pub mod families;
pub mod files;
pub mod image;
mod launch;
pub mod sandbox;
pub mod spawn;
pub mod task;

pub use episode::{CommandOutput, Ending, Episode, EpisodeReport};
pub use error::EnvError;
pub use image::{FileLock, Image, ImageCache, ImageSpec};
pub use launch::write_file;
pub use sandbox::{EpisodeLimits, Isolation, IsolationMode, Rootfs, Sandbox};
pub use task::{Task, TaskCheck, Verdict};
