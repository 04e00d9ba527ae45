//! Prompt datasets: JSONL or Parquet files of prompts with labels, read into [`PromptRow`]s and
//! served in a seeded, resumable order.
//!
//! - A path ending in `.parquet` is read as Parquet (snappy, gzip or uncompressed pages; nested
//!   list and struct columns become JSON arrays and objects, as pandas/pyarrow wrote them); anything
//!   else is JSONL. Row numbers in errors are 1-based lines (JSONL) or rows (Parquet).
//! - The path may end in `@[a:b]` (Python slice bounds, either may be omitted or negative) to use a
//!   slice of the rows.
//! - Keys are configurable: the input (a string, or a list of chat messages), the label, metadata
//!   and tools. A key with dots (`reward_model.ground_truth`) reaches into nested objects when no
//!   column has that exact name.
//! - A row without the input key, or without the label key when the reward reads labels
//!   (`require_label`), is an error naming the file, line and key, or is skipped and counted when
//!   the recipe says so. A reward that reads no label gets an empty one.
//! - A JSONL line that is not UTF-8 is an error naming its line and the byte offset.
//! - [`PromptOrder`] shuffles each epoch with the seed; its position is two numbers that
//!   checkpoints save and restore.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where the prompts come from and how a row is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// A JSONL or Parquet file, optionally with a row slice: `train.jsonl@[100:-100]`.
    pub path: String,
    pub input_key: String,
    pub label_key: String,
    /// The row's metadata for rewards and agents: one (dotted) key, or `*` for the whole row.
    pub metadata_key: Option<String>,
    pub tools_key: Option<String>,
    /// Skip (and count) rows without the input key (or the required label) instead of failing.
    pub skip_bad_rows: bool,
    /// Every row must have the label key (the reward reads labels; see
    /// `RewardConfig::needs_label`). Otherwise a row without one gets an empty label.
    pub require_label: bool,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            path: String::new(),
            input_key: "prompt".into(),
            label_key: "label".into(),
            metadata_key: None,
            tools_key: None,
            skip_bad_rows: false,
            require_label: true,
        }
    }
}

/// The input of a row: a plain prompt or chat messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Messages(Vec<Value>),
}

/// One dataset row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRow {
    /// 1-based line (JSONL) or row (Parquet) in the file.
    pub line: usize,
    pub input: PromptInput,
    /// The label as text (a JSON string's content, or other JSON as written); empty when the row
    /// has none and none is required.
    pub label: String,
    pub metadata: Value,
    pub tools: Option<Vec<Value>>,
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: cannot read")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Row {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("data.path `{0}`: {1}")]
    Path(String, String),
}

/// What loading found.
#[derive(Debug)]
pub struct Dataset {
    pub rows: Vec<PromptRow>,
    /// Rows skipped for lacking the input key or the required label (with `skip_bad_rows`).
    pub skipped: usize,
}

/// Splits `file@[a:b]` into the file and the slice bounds.
pub fn parse_path(spec: &str) -> Result<(PathBuf, Option<i64>, Option<i64>), DataError> {
    let Some((file, slice)) = spec.rsplit_once('@') else {
        return Ok((PathBuf::from(spec), None, None));
    };
    let bad = |why: &str| DataError::Path(spec.to_owned(), why.to_owned());
    let inner = slice
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or_else(|| bad("a slice is written @[start:end]"))?;
    let (a, b) = inner
        .split_once(':')
        .ok_or_else(|| bad("a slice is written @[start:end]"))?;
    let bound = |s: &str| -> Result<Option<i64>, DataError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse()
            .map(Some)
            .map_err(|_| bad("slice bounds must be integers"))
    };
    Ok((PathBuf::from(file), bound(a)?, bound(b)?))
}

/// Python slice semantics for `len` items.
fn resolve(bound: Option<i64>, len: usize, default: usize) -> usize {
    match bound {
        None => default,
        Some(b) if b < 0 => len.saturating_sub(b.unsigned_abs() as usize),
        Some(b) => (b as usize).min(len),
    }
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `key` in `object`: the exact key, or else a dotted path into nested objects.
fn lookup<'a>(object: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    if let Some(v) = object.get(key) {
        return Some(v);
    }
    let mut parts = key.split('.');
    let mut v = object.get(parts.next()?)?;
    for part in parts {
        v = v.as_object()?.get(part)?;
    }
    Some(v)
}

/// One record of a dataset file: its 1-based line (JSONL) or row (Parquet), and its value or what
/// is wrong with it.
type Record = (usize, Result<Value, String>);

/// The records of a dataset file.
fn read_records(path: &Path) -> Result<Vec<Record>, DataError> {
    let io = |source| DataError::Io {
        path: path.to_owned(),
        source,
    };
    if path.extension().is_some_and(|e| e == "parquet") {
        return read_parquet(path);
    }
    let bytes = std::fs::read(path).map_err(io)?;
    Ok(jsonl_records(&bytes))
}

/// The non-blank lines of JSONL `bytes`, each checked for UTF-8 on its own so that a bad byte is
/// reported at its line (and offset) rather than for the whole file.
fn jsonl_records(bytes: &[u8]) -> Vec<Record> {
    let mut records = Vec::new();
    let mut line_start = 0;
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let offset = line_start;
        line_start += raw.len() + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let value = match std::str::from_utf8(raw) {
            Err(e) => Err(format!(
                "not UTF-8 (byte offset {} in the file, {} in the line)",
                offset + e.valid_up_to(),
                e.valid_up_to()
            )),
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}")),
        };
        records.push((i + 1, value));
    }
    records
}

/// A Parquet file's rows as JSON objects.
fn read_parquet(path: &Path) -> Result<Vec<Record>, DataError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).map_err(|source| DataError::Io {
        path: path.to_owned(),
        source,
    })?;
    let not_parquet = |e: parquet::errors::ParquetError| {
        DataError::Path(
            path.display().to_string(),
            format!("not a readable Parquet file: {e}"),
        )
    };
    let reader = SerializedFileReader::new(file).map_err(not_parquet)?;
    let rows = reader.get_row_iter(None).map_err(not_parquet)?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| DataError::Row {
            path: path.to_owned(),
            line: i + 1,
            message: format!("unreadable Parquet row: {e}"),
        })?;
        out.push((i + 1, Ok(row.to_json_value())));
    }
    Ok(out)
}

/// Loads the rows `config` names.
pub fn load(config: &DataConfig) -> Result<Dataset, DataError> {
    let (path, start, end) = parse_path(&config.path)?;
    let mut rows = Vec::new();
    let mut skipped = 0;
    for (line, value) in read_records(&path)? {
        let fail = |message: String| DataError::Row {
            path: path.clone(),
            line,
            message,
        };
        let value = value.map_err(fail)?;
        let Some(object) = value.as_object() else {
            return Err(fail("expected a JSON object".into()));
        };
        // A null (Parquet's missing value) counts as absent.
        let input = match lookup(object, &config.input_key).filter(|v| !v.is_null()) {
            Some(Value::String(s)) => PromptInput::Text(s.clone()),
            Some(Value::Array(m)) => PromptInput::Messages(m.clone()),
            Some(_) => {
                return Err(fail(format!(
                    "`{}` must be a string or a list of chat messages",
                    config.input_key
                )))
            }
            None if config.skip_bad_rows => {
                skipped += 1;
                continue;
            }
            None => {
                return Err(fail(format!(
                    "no `{}` (the input key; set data.input_key, or data.skip_bad_rows = true)",
                    config.input_key
                )))
            }
        };
        let tools = match config.tools_key.as_ref().and_then(|k| lookup(object, k)) {
            None | Some(Value::Null) => None,
            Some(Value::Array(t)) => Some(t.clone()),
            Some(_) => return Err(fail("tools must be a list of tool schemas".into())),
        };
        let label = match lookup(object, &config.label_key).filter(|v| !v.is_null()) {
            Some(v) => text_of(v),
            None if !config.require_label => String::new(),
            None if config.skip_bad_rows => {
                skipped += 1;
                continue;
            }
            None => {
                return Err(fail(format!(
                    "no `{}` (the label key, which the reward reads; set data.label_key, or data.skip_bad_rows = true)",
                    config.label_key
                )))
            }
        };
        rows.push(PromptRow {
            line,
            input,
            label,
            metadata: match config.metadata_key.as_deref() {
                Some("*") => Value::Object(object.clone()),
                Some(k) => lookup(object, k).cloned().unwrap_or(Value::Null),
                None => Value::Null,
            },
            tools,
        });
    }
    let len = rows.len();
    let (a, b) = (resolve(start, len, 0), resolve(end, len, len));
    let rows = if a < b {
        rows.drain(a..b).collect()
    } else {
        Vec::new()
    };
    Ok(Dataset { rows, skipped })
}

pub use ooze_core::order::{Position, PromptOrder};

/// Rows whose prompt is longer than `max_tokens` (by `count_tokens`) removed; returns how many.
pub fn drop_long_prompts(
    rows: &mut Vec<PromptRow>,
    max_tokens: usize,
    count_tokens: impl Fn(&PromptRow) -> usize,
) -> usize {
    let before = rows.len();
    rows.retain(|r| count_tokens(r) <= max_tokens);
    before - rows.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(lines: &[&str]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), lines.join("\n")).unwrap();
        f
    }

    #[test]
    fn rows_keys_and_slices() {
        let f = write(&[
            r#"{"question": "1+1?", "answer": 2, "meta": {"id": 1}}"#,
            r#"{"question": [{"role": "user", "content": "hi"}], "answer": "x"}"#,
            r#"{"question": "3?", "answer": "3"}"#,
        ]);
        let path = f.path().to_string_lossy().into_owned();
        let config = DataConfig {
            path: path.clone(),
            input_key: "question".into(),
            label_key: "answer".into(),
            metadata_key: Some("meta".into()),
            ..Default::default()
        };
        let d = load(&config).unwrap();
        assert_eq!(d.rows.len(), 3);
        assert_eq!(d.rows[0].label, "2");
        assert_eq!(d.rows[0].metadata["id"], 1);
        assert!(matches!(d.rows[1].input, PromptInput::Messages(_)));
        let whole = load(&DataConfig {
            metadata_key: Some("*".into()),
            ..config.clone()
        })
        .unwrap();
        assert_eq!(whole.rows[0].metadata["meta"]["id"], 1);
        assert_eq!(whole.rows[2].metadata["answer"], "3");
        for (slice, lines) in [
            ("@[1:]", vec![2, 3]),
            ("@[:-1]", vec![1, 2]),
            ("@[-1:]", vec![3]),
        ] {
            let d = load(&DataConfig {
                path: format!("{path}{slice}"),
                ..config.clone()
            })
            .unwrap();
            assert_eq!(
                d.rows.iter().map(|r| r.line).collect::<Vec<_>>(),
                lines,
                "{slice}"
            );
        }
        assert!(parse_path("x.jsonl@[a:2]").is_err());
    }

    #[test]
    fn a_row_without_the_input_is_named_or_skipped() {
        let f = write(&[
            r#"{"prompt": "a", "label": "1"}"#,
            r#"{"text": "b", "label": "2"}"#,
        ]);
        let mut config = DataConfig {
            path: f.path().to_string_lossy().into_owned(),
            ..Default::default()
        };
        let err = load(&config).unwrap_err().to_string();
        assert!(
            err.ends_with(
                ":2: no `prompt` (the input key; set data.input_key, or data.skip_bad_rows = true)"
            ),
            "{err}"
        );
        config.skip_bad_rows = true;
        let d = load(&config).unwrap();
        assert_eq!((d.rows.len(), d.skipped), (1, 1));
    }

    #[test]
    fn a_row_without_a_required_label_is_named_or_skipped() {
        let f = write(&[
            r#"{"prompt": "a", "label": "1"}"#,
            r#"{"prompt": "b"}"#,
            r#"{"prompt": "c", "label": null}"#,
            r#"{"prompt": "d", "label": 4}"#,
        ]);
        let path = f.path().to_string_lossy().into_owned();
        let mut config = DataConfig {
            path: path.clone(),
            ..Default::default()
        };
        let err = load(&config).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("{path}:2: no `label` (the label key, which the reward reads; set data.label_key, or data.skip_bad_rows = true)")
        );
        config.skip_bad_rows = true;
        let d = load(&config).unwrap();
        assert_eq!((d.rows.len(), d.skipped), (2, 2));
        assert_eq!(
            d.rows
                .iter()
                .map(|r| (r.line, r.label.as_str()))
                .collect::<Vec<_>>(),
            [(1, "1"), (4, "4")]
        );
        // A reward that reads no label takes every row, unlabelled ones with an empty label.
        config.skip_bad_rows = false;
        config.require_label = false;
        let d = load(&config).unwrap();
        assert_eq!(d.rows.len(), 4);
        assert_eq!(d.rows[1].label, "");
    }

    #[test]
    fn a_line_that_is_not_utf8_is_named_with_its_byte_offset() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut bytes = b"{\"prompt\": \"a\", \"label\": \"1\"}\r\n\n".to_vec();
        bytes.extend_from_slice(b"{\"prompt\": \"b\xff\", \"label\": \"2\"}\n");
        std::fs::write(f.path(), &bytes).unwrap();
        let path = f.path().to_string_lossy().into_owned();
        let err = load(&DataConfig {
            path: path.clone(),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        // Line 3 starts at byte 32; the bad byte is its 13th.
        assert_eq!(
            err,
            format!("{path}:3: not UTF-8 (byte offset 45 in the file, 13 in the line)")
        );
        // The lines before it (CRLF and a blank one) read as before.
        std::fs::write(f.path(), &bytes[..32]).unwrap();
        let d = load(&DataConfig {
            path,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(d.rows.len(), 1);
        assert_eq!(d.rows[0].input, PromptInput::Text("a".into()));
    }

    #[test]
    fn order_is_seeded_per_epoch_and_resumes() {
        let mut a = PromptOrder::new(5, 9, true, Position::default());
        let first = a.take(7);
        let mut sorted = first[..5].to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4], "an epoch is a permutation");
        assert_eq!(
            a.position(),
            Position {
                epoch: 1,
                offset: 2
            }
        );
        let mut resumed = PromptOrder::new(5, 9, true, a.position());
        let mut straight = PromptOrder::new(5, 9, true, Position::default());
        straight.take(7);
        assert_eq!(resumed.take(6), straight.take(6));
        let mut rows: Vec<PromptRow> = (0..4)
            .map(|i| PromptRow {
                line: i + 1,
                input: PromptInput::Text("x".repeat(i * 10)),
                label: String::new(),
                metadata: Value::Null,
                tools: None,
            })
            .collect();
        let dropped = drop_long_prompts(&mut rows, 15, |r| match &r.input {
            PromptInput::Text(t) => t.len(),
            PromptInput::Messages(_) => 0,
        });
        assert_eq!((dropped, rows.len()), (2, 2));
    }
}
