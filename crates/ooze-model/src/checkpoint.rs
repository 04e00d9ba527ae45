//! Safetensors weights in the Hugging Face layout: `model.safetensors`, or shards
//! `model-0000i-of-0000n.safetensors` listed by `model.safetensors.index.json` (`weight_map`:
//! tensor name → shard file). Reading memory-maps each file and copies every tensor into libtorch
//! once, converting to the requested dtype and device; writing shards by size, each file atomically,
//! the index last so no reader sees an index that points at a half-written shard.

use crate::error::{read_json, write_atomic, ModelError, Result};
use ooze_torch::tch::{Device, Kind, Tensor};
use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Named tensors loaded from a checkpoint, with the file each came from (for error messages).
pub struct WeightSet {
    pub dir: PathBuf,
    tensors: HashMap<String, (Tensor, PathBuf)>,
}

#[derive(Serialize, Deserialize)]
struct Index {
    #[serde(default)]
    metadata: serde_json::Map<String, serde_json::Value>,
    weight_map: BTreeMap<String, String>,
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F32 => Some(Kind::Float),
        Dtype::BF16 => Some(Kind::BFloat16),
        Dtype::F16 => Some(Kind::Half),
        _ => None,
    }
}

impl WeightSet {
    /// Loads every tensor of the checkpoint in `dir` onto `device` as `kind`.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<WeightSet> {
        let index_path = dir.join(INDEX_FILE);
        let files: Vec<(PathBuf, Option<Vec<String>>)> = if index_path.exists() {
            let index: Index = read_json(&index_path, "a safetensors index")?;
            let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (tensor, file) in index.weight_map {
                by_file.entry(file).or_default().push(tensor);
            }
            by_file
                .into_iter()
                .map(|(file, names)| (dir.join(file), Some(names)))
                .collect()
        } else if dir.join(SINGLE_FILE).exists() {
            vec![(dir.join(SINGLE_FILE), None)]
        } else {
            return Err(ModelError::NoWeights {
                dir: dir.to_owned(),
            });
        };
        let mut tensors = HashMap::new();
        for (path, expected) in files {
            let file = std::fs::File::open(&path).map_err(ModelError::io(&path))?;
            // SAFETY: the map is read-only and dropped before this function returns; a checkpoint
            // being rewritten underneath a reader is outside what any loader can guard against.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(ModelError::io(&path))?;
            let st = safetensors::SafeTensors::deserialize(&map).map_err(|e| {
                ModelError::Safetensors {
                    path: path.clone(),
                    message: e.to_string(),
                }
            })?;
            if let Some(expected) = expected {
                for name in expected {
                    if st.tensor(&name).is_err() {
                        return Err(ModelError::Safetensors {
                            path: path.clone(),
                            message: format!(
                                "the index lists tensor `{name}` here, but the file lacks it"
                            ),
                        });
                    }
                }
            }
            for (name, view) in st.tensors() {
                let tensor = to_tensor(&path, &name, &view)?
                    .f_to_device(device)?
                    .f_to_kind(kind)?;
                tensors.insert(name, (tensor, path.clone()));
            }
        }
        Ok(WeightSet {
            dir: dir.to_owned(),
            tensors,
        })
    }

    /// Wraps tensors already in memory (a trainer's parameters), converted to `device` and `kind`.
    pub fn from_tensors(
        tensors: Vec<(String, Tensor)>,
        device: Device,
        kind: Kind,
    ) -> Result<WeightSet> {
        let origin = PathBuf::from("<in-memory weights>");
        let mut map = HashMap::with_capacity(tensors.len());
        for (name, t) in tensors {
            map.insert(
                name,
                (t.f_to_device(device)?.f_to_kind(kind)?, origin.clone()),
            );
        }
        Ok(WeightSet {
            dir: origin,
            tensors: map,
        })
    }

    /// Removes and returns a tensor, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let (tensor, _) = self
            .tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor {
                dir: self.dir.clone(),
                tensor: name.into(),
            })?;
        if tensor.size() != shape {
            return Err(ModelError::TensorShape {
                tensor: name.into(),
                expected: shape.to_vec(),
                actual: tensor.size(),
            });
        }
        Ok(tensor)
    }

    /// Removes a tensor if present (for optional tensors such as a tied `lm_head.weight`).
    pub fn discard(&mut self, name: &str) -> bool {
        self.tensors.remove(name).is_some()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Fails if tensors remain that nothing took (a checkpoint of another architecture, say).
    pub fn finish(self) -> Result<()> {
        let mut left: Vec<String> = self
            .tensors
            .into_keys()
            .filter(|name| !name.ends_with("rotary_emb.inv_freq"))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        left.sort();
        Err(ModelError::UnexpectedTensors {
            dir: self.dir,
            tensors: left,
        })
    }
}

fn to_tensor(path: &Path, name: &str, view: &TensorView<'_>) -> Result<Tensor> {
    let kind = kind_of(view.dtype()).ok_or_else(|| ModelError::UnsupportedDtype {
        path: path.to_owned(),
        tensor: name.to_owned(),
        dtype: format!("{:?}", view.dtype()),
    })?;
    let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    Ok(Tensor::f_from_data_size(view.data(), &shape, kind)?)
}

/// How to write a checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct SaveOptions {
    /// Shards are cut before they would exceed this many bytes (a single larger tensor gets its own).
    pub max_shard_bytes: usize,
    /// dtype of the written tensors.
    pub kind: Kind,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            max_shard_bytes: 5 << 30,
            kind: Kind::Float,
        }
    }
}

struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl safetensors::View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn to_host(tensor: &Tensor, kind: Kind) -> Result<HostTensor> {
    let dtype = match kind {
        Kind::Float => Dtype::F32,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        other => {
            return Err(ModelError::Invalid(format!(
                "cannot save tensors of kind {other:?}"
            )))
        }
    };
    let host = tensor
        .f_to_device(Device::Cpu)?
        .f_to_kind(kind)?
        .f_contiguous()?;
    let numel = host.numel();
    let mut bytes = vec![0u8; numel * kind.elt_size_in_bytes()];
    host.f_copy_data_u8(&mut bytes, numel)?;
    let shape = host.size().iter().map(|&d| d as usize).collect();
    Ok(HostTensor {
        dtype,
        shape,
        bytes,
    })
}

/// Writes `tensors` into `dir` (created if needed) as safetensors, sharded with an index when they
/// exceed one shard. Returns the files written.
pub fn save_weights(
    dir: &Path,
    tensors: &[(String, Tensor)],
    options: SaveOptions,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(ModelError::io_doing("create directory", dir))?;
    let mut shards: Vec<Vec<(String, HostTensor)>> = vec![Vec::new()];
    let mut shard_bytes = 0usize;
    let mut total = 0usize;
    for (name, tensor) in tensors {
        let host = to_host(tensor, options.kind)?;
        let size = host.bytes.len();
        if shard_bytes > 0 && shard_bytes + size > options.max_shard_bytes {
            shards.push(Vec::new());
            shard_bytes = 0;
        }
        shard_bytes += size;
        total += size;
        shards
            .last_mut()
            .expect("invariant: shards starts non-empty")
            .push((name.clone(), host));
    }
    let metadata = Some(HashMap::from([("format".to_owned(), "pt".to_owned())]));
    let count = shards.len();
    let mut written = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            SINGLE_FILE.to_owned()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, count)
        };
        let bytes =
            safetensors::serialize(shard.iter().map(|(n, t)| (n.as_str(), t)), metadata.clone())
                .map_err(|e| ModelError::Safetensors {
                    path: dir.join(&file),
                    message: e.to_string(),
                })?;
        write_atomic(&dir.join(&file), &bytes)?;
        for (name, _) in shard {
            weight_map.insert(name.clone(), file.clone());
        }
        written.push(dir.join(file));
    }
    let index_path = dir.join(INDEX_FILE);
    if count > 1 {
        let mut meta = serde_json::Map::new();
        meta.insert("total_size".into(), total.into());
        let index = Index {
            metadata: meta,
            weight_map,
        };
        let text = serde_json::to_string_pretty(&index).expect("invariant: index serialises");
        write_atomic(&index_path, text.as_bytes())?;
        written.push(index_path);
        let single = dir.join(SINGLE_FILE);
        if single.exists() {
            std::fs::remove_file(&single).map_err(ModelError::io_doing("remove", &single))?;
        }
    } else if index_path.exists() {
        std::fs::remove_file(&index_path).map_err(ModelError::io_doing("remove", &index_path))?;
    }
    Ok(written)
}

/// The non-weight files of a Hugging Face model directory.
pub const MODEL_FILES: &[&str] = &[
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "config.json",
];

/// Writes a complete model directory: `tensors` as safetensors, and the config and tokenizer files
/// that exist in `source` copied over (each atomically, `config.json` last, so a directory with a
/// config is complete).
pub fn export_model(
    source: &Path,
    out: &Path,
    tensors: &[(String, Tensor)],
    options: SaveOptions,
) -> Result<()> {
    save_weights(out, tensors, options)?;
    for name in MODEL_FILES {
        let from = source.join(name);
        if from.exists() {
            let bytes = std::fs::read(&from).map_err(ModelError::io(&from))?;
            write_atomic(&out.join(name), &bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_tensors() -> Vec<(String, Tensor)> {
        vec![
            (
                "a.weight".into(),
                Tensor::arange(12, (Kind::Float, Device::Cpu)).view([3, 4]),
            ),
            (
                "b.weight".into(),
                Tensor::ones([5], (Kind::Float, Device::Cpu)) * 0.5,
            ),
            (
                "c.bias".into(),
                Tensor::arange(6, (Kind::Float, Device::Cpu)) - 2.0,
            ),
        ]
    }

    #[test]
    fn sharded_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let files = save_weights(
            dir.path(),
            &sample_tensors(),
            SaveOptions {
                max_shard_bytes: 48,
                kind: Kind::Float,
            },
        )
        .unwrap();
        assert_eq!(files.len(), 3, "two shards and an index: {files:?}");
        assert!(dir.path().join("model-00002-of-00002.safetensors").exists());
        let mut set = WeightSet::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
        let a = set.take("a.weight", &[3, 4]).unwrap();
        assert_eq!(a.double_value(&[2, 3]), 11.0);
        assert!(set
            .take("b.weight", &[4])
            .unwrap_err()
            .to_string()
            .contains("has shape [5]; expected [4]"));
        let err = set.take("zzz", &[1]).unwrap_err().to_string();
        assert!(err.contains("tensor `zzz` is missing"), "{err}");
        let err = set.finish().unwrap_err().to_string();
        assert!(err.contains("c.bias"), "{err}");
    }

    #[test]
    fn bf16_single_file() {
        let dir = tempfile::tempdir().unwrap();
        save_weights(
            dir.path(),
            &sample_tensors(),
            SaveOptions {
                kind: Kind::BFloat16,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(dir.path().join(SINGLE_FILE).exists());
        assert!(!dir.path().join(INDEX_FILE).exists());
        let mut set = WeightSet::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
        assert_eq!(set.take("c.bias", &[6]).unwrap().double_value(&[0]), -2.0);
    }

    fn load_err(dir: &Path) -> String {
        match WeightSet::load(dir, Device::Cpu, Kind::Float) {
            Ok(_) => panic!("loading {} should fail", dir.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn corrupt_and_missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_err(dir.path());
        assert!(err.contains("no weights found"), "{err}");
        std::fs::write(
            dir.path().join(SINGLE_FILE),
            b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
        )
        .unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("model.safetensors: not a valid safetensors file"),
            "{err}"
        );
        std::fs::write(
            dir.path().join(INDEX_FILE),
            r#"{"weight_map": {"x": "model-00001-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("model-00001-of-00002.safetensors: cannot read"),
            "{err}"
        );
    }
}
