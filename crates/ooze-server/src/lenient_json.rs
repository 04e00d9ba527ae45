//! Request bodies as agents and routers send them. Every field of the OpenAI, Anthropic and SGLang
//! request schemas is accepted: a field ooze does not act on is ignored, never a 400, and counted
//! by its path (`store`, `sampling_params.no_stop_trim`, `messages.*.name`) in the server's
//! [`IgnoredFields`], which `/get_server_info` reports; the first time a name is seen the server
//! says so on stderr, so a misspelt field is still found. A body that is not JSON, or whose
//! fields ooze does act on have the wrong type, is a 400 naming the path at fault.

use crate::error::ApiError;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A JSON body of type `T`, its unknown fields counted in the server's [`IgnoredFields`].
pub struct LenientJson<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<Arc<AppState>> for LenientJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            match crate::timed_body::caused_by_timeout(&e) {
                Some(timeout) => ApiError {
                    code: "request_timeout",
                    message: timeout.to_string(),
                },
                None => ApiError {
                    code: "invalid_json",
                    message: format!("reading the body: {e}"),
                },
            }
        })?;
        let (value, ignored) = parse(&bytes)?;
        state.ignored_fields.count(&ignored);
        Ok(LenientJson(value))
    }
}

/// `bytes` as a `T`, and the paths of the fields `T` has no place for.
pub fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<(T, Vec<String>), ApiError> {
    let mut ignored = Vec::new();
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let fail = |at: String, e: serde_json::Error| ApiError {
        code: "invalid_json",
        message: if at == "." || at == "?" {
            format!("the JSON body: {e}")
        } else {
            format!("the JSON body at `{at}`: {e}")
        },
    };
    let mut note = |path: serde_ignored::Path| ignored.push(field_name(&path.to_string()));
    let value =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&mut json, &mut note))
            .map_err(|e| fail(e.path().to_string(), e.into_inner()))?;
    json.end().map_err(|e| fail(".".into(), e))?;
    Ok((value, ignored))
}

/// Adds to `ignored` the fields of `obj` other than `known`, named under `path`
/// (`messages.*.content.*` gives `messages.*.content.*.cache_control`): for parts of a body
/// taken as JSON values (content blocks, input items), which serde does not see into.
pub fn unknown_fields(
    obj: &serde_json::Map<String, serde_json::Value>,
    known: &[&str],
    path: &str,
    ignored: &mut Vec<String>,
) {
    ignored.extend(
        obj.keys()
            .filter(|k| !known.contains(&k.as_str()))
            .map(|k| format!("{path}.{k}")),
    );
}

/// A field's path with array indices as `*`, so one name counts a field of every message.
fn field_name(path: &str) -> String {
    path.split('.')
        .map(|part| {
            if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// How often each ignored field (by path) has been sent to this server.
#[derive(Default)]
pub struct IgnoredFields(Mutex<BTreeMap<String, u64>>);

impl IgnoredFields {
    /// Counts `names` once each; a name seen for the first time is said on stderr.
    pub fn count(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for name in names {
            let n = counts.entry(name.clone()).or_insert(0);
            if *n == 0 {
                eprintln!(
                    "ooze: ignoring request field `{name}` (not acted on; counted: \
                     /get_server_info's ignored_fields, or a gateway session's \
                     gateway/ignored_field/ metrics)"
                );
            }
            *n += 1;
        }
    }

    /// The counts so far, by field path.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct Body {
        messages: Vec<Message>,
        max_tokens: Option<u32>,
    }

    #[derive(Deserialize, Debug)]
    struct Message {
        #[allow(dead_code)]
        role: String,
    }

    #[test]
    fn unknown_fields_are_named_and_known_ones_checked() {
        let (body, ignored) = parse::<Body>(
            br#"{"messages": [{"role": "user", "name": "a"}, {"role": "x", "name": "b"}],
                 "store": true, "metadata": {"k": "v"}, "max_tokens": 3}"#,
        )
        .unwrap();
        assert_eq!((body.messages.len(), body.max_tokens), (2, Some(3)));
        assert_eq!(
            ignored,
            vec!["messages.*.name", "messages.*.name", "store", "metadata"]
        );
        let err = parse::<Body>(br#"{"messages": [], "max_tokens": "many"}"#).unwrap_err();
        assert_eq!(err.code, "invalid_json");
        assert!(err.message.contains("`max_tokens`"), "{}", err.message);
        let err = parse::<Body>(br#"{"messages": [] "#).unwrap_err();
        assert!(
            err.message.starts_with("the JSON body: "),
            "{}",
            err.message
        );
        let err = parse::<Body>(br#"{"messages": []} trailing"#).unwrap_err();
        assert!(err.message.contains("trailing"), "{}", err.message);
    }

    #[test]
    fn counts_accumulate_by_name() {
        let fields = IgnoredFields::default();
        fields.count(&["store".into(), "store".into()]);
        fields.count(&["metadata".into()]);
        assert_eq!(
            fields.snapshot(),
            BTreeMap::from([("metadata".into(), 1), ("store".into(), 2)])
        );
    }
}
