//! The one error type of ooze-model. Every variant names the file, key or tensor at fault and what
//! was expected.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file or directory that could not be read, created or removed (`action` says which).
    #[error("{path}: cannot {action}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON for {what}")]
    Json {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: key `{key}`: {message}")]
    Config {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{path}: unknown model_type `{model_type}`; ooze supports qwen2, qwen3 and llama")]
    UnknownModelType { path: PathBuf, model_type: String },
    #[error("{dir}: no weights found; expected model.safetensors or model.safetensors.index.json")]
    NoWeights { dir: PathBuf },
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("{path}: tensor `{tensor}` has dtype {dtype}; ooze reads F32, BF16 and F16")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("tensor `{tensor}` is missing from the checkpoint in {dir}")]
    MissingTensor { dir: PathBuf, tensor: String },
    #[error("tensor `{tensor}` has shape {actual:?}; expected {expected:?} from config.json")]
    TensorShape {
        tensor: String,
        expected: Vec<i64>,
        actual: Vec<i64>,
    },
    #[error("{dir}: unexpected tensors that this model does not use: {tensors:?}")]
    UnexpectedTensors { dir: PathBuf, tensors: Vec<String> },
    #[error("{path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("chat template ({source_name}): {message}")]
    Template {
        source_name: String,
        message: String,
    },
    #[error("chat template ({source_name}) raised an exception: {message}")]
    TemplateRaised {
        source_name: String,
        message: String,
    },
    #[error("{0}")]
    Invalid(String),
    /// A file that could not be written (replaced atomically; see [`ooze_core::atomic_file`]).
    #[error(transparent)]
    Write(#[from] ooze_core::atomic_file::AtomicFileError),
    /// A libtorch failure. Its message is the whole story (tch errors have no cause of their own),
    /// so it is printed here and not also exposed as a source for error chains to repeat.
    #[error("libtorch: {0}")]
    Torch(ooze_torch::tch::TchError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl From<ooze_torch::tch::TchError> for ModelError {
    fn from(e: ooze_torch::tch::TchError) -> ModelError {
        ModelError::Torch(e)
    }
}

impl ModelError {
    /// Maps a failed read of `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
        ModelError::io_doing("read", path)
    }

    /// Maps a failure to `action` (`create directory`, `remove`, …) on `path`.
    pub(crate) fn io_doing(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ModelError {
        let path = path.into();
        move |source| ModelError::Io {
            action,
            path,
            source,
        }
    }
}

/// Reads and parses a JSON file, naming the file on failure.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    what: &'static str,
) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(ModelError::io(path))?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.to_owned(),
        what,
        source,
    })
}

/// Replaces `path` with `bytes` atomically (the one writer: [`ooze_core::atomic_file::write`]).
pub(crate) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    Ok(ooze_core::atomic_file::write(path, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;
    use std::path::Path;

    /// The error and its causes as the binary prints them (`anyhow`'s `{:#}`).
    fn chain(e: &dyn Error) -> String {
        let mut parts = vec![e.to_string()];
        let mut cause = e.source();
        while let Some(c) = cause {
            parts.push(c.to_string());
            cause = c.source();
        }
        parts.join(": ")
    }

    /// The OS's text for ENOTDIR, the cause of every failure under `/dev/full/` (a device, not a
    /// directory).
    #[cfg(target_os = "linux")] // /dev/full
    fn not_a_directory() -> String {
        std::io::Error::from_raw_os_error(20).to_string()
    }

    #[test]
    #[cfg(target_os = "linux")] // /dev/full
    fn a_failed_write_says_writing_the_path_with_its_cause_once() {
        let path = Path::new("/dev/full/config.json");
        let err = write_atomic(path, b"{}").unwrap_err();
        let text = chain(&err);
        assert!(
            text.starts_with("writing /dev/full/config.json: "),
            "{text}"
        );
        assert!(!text.contains("read"), "{text}");
        assert_eq!(text.matches(&not_a_directory()).count(), 1, "{text}");
    }

    #[test]
    #[cfg(target_os = "linux")] // /dev/full
    fn a_failed_directory_creation_says_so_with_its_cause_once() {
        let dir = Path::new("/dev/full/model");
        let err = crate::checkpoint::save_weights(dir, &[], Default::default()).unwrap_err();
        let text = chain(&err);
        assert!(
            text.starts_with("/dev/full/model: cannot create directory: "),
            "{text}"
        );
        assert_eq!(text.matches(&not_a_directory()).count(), 1, "{text}");
    }

    #[test]
    fn a_failed_read_names_the_path_with_its_cause_once() {
        let path = Path::new("/nonexistent-ooze-dir/config.json");
        let err = read_json::<serde_json::Value>(path, "a config").unwrap_err();
        let text = chain(&err);
        assert!(
            text.starts_with("/nonexistent-ooze-dir/config.json: cannot read: "),
            "{text}"
        );
        let cause = std::io::Error::from_raw_os_error(2).to_string();
        assert_eq!(text.matches(&cause).count(), 1, "{text}");
    }

    #[test]
    fn bad_json_prints_the_parse_error_once() {
        let dir = std::env::temp_dir().join(format!("ooze-model-error-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = read_json::<serde_json::Value>(&path, "a config").unwrap_err();
        let text = chain(&err);
        let parse = err.source().unwrap().to_string();
        assert_eq!(text.matches(&parse).count(), 1, "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
