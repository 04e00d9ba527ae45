//! Identifier newtypes, so a group index can never be passed where a sample index is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$inner> for $name {
            fn from(value: $inner) -> Self {
                Self(value)
            }
        }
    };
}

id_type!(
    /// The prompt group a sample belongs to: the `n` samples drawn for one prompt share it, and
    /// group-relative advantages are computed over it.
    GroupIndex(u64)
);
id_type!(
    /// A globally unique index of one sample within a run.
    SampleIndex(u64)
);
id_type!(
    /// One agent execution. Several samples cut from one execution (multi-agent calls, segments of a
    /// long trajectory) share it, so aggregation counts the execution once and keeps siblings together.
    RolloutId(u64)
);
id_type!(
    /// Routing key for multi-turn prefix reuse: requests of one session go to the same engine.
    SessionId(String)
);
