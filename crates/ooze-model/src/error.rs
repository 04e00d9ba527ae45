//! The one error type of ooze-model. Every variant names the file, key or tensor at fault and what
//! was expected.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON for {what}: {source}")]
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
    #[error("libtorch: {0}")]
    Torch(#[from] ooze_torch::tch::TchError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
        let path = path.into();
        move |source| ModelError::Io { path, source }
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

/// Writes a file atomically: a temporary sibling, then a rename.
pub(crate) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp-{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).map_err(ModelError::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(ModelError::io(path))
}
