//! Search: a BM25 index over a JSONL corpus, the same index served over HTTP with Search-R1's
//! retrieval API, and a client that uses either.
//!
//! Corpus rows are Search-R1's: `{"id": "…", "contents": "Title\ntext"}`; rows with `title` and
//! `text` instead are accepted too. The service answers `POST /retrieve` with
//! `{"queries": [...], "topk": 3, "return_scores": true}` → `{"result": [[{"document": row,
//! "score": s}, ...], ...]}` (without scores: `{"result": [[row, ...], ...]}`), so Search-R1's own
//! client code works against it, and ooze's client works against Search-R1's servers.
//!
//! Scoring is Okapi BM25 with Pyserini's defaults (k1 = 0.9, b = 0.4) over lower-cased
//! alphanumeric terms without English stop words.

use ooze_rollout::http_client::{HttpError, JsonClient};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One retrieved document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// The corpus row as stored (`id`, `contents`, anything else).
    pub row: Value,
    pub score: f64,
}

impl Document {
    /// `contents`, or `title\ntext`.
    pub fn contents(&self) -> String {
        contents_of(&self.row).unwrap_or_default()
    }

    /// The title (the first line of `contents`) and the text after it.
    pub fn title_and_text(&self) -> (String, String) {
        let contents = self.contents();
        match contents.split_once('\n') {
            Some((title, text)) => (title.trim_matches('"').to_owned(), text.to_owned()),
            None => (String::new(), contents),
        }
    }
}

fn contents_of(row: &Value) -> Option<String> {
    if let Some(c) = row.get("contents").and_then(Value::as_str) {
        return Some(c.to_owned());
    }
    let title = row.get("title").and_then(Value::as_str)?;
    let text = row.get("text").and_then(Value::as_str).unwrap_or("");
    Some(format!("{title}\n{text}"))
}

/// Search-R1's observation format: `Doc 1(Title: t) text` per document, one per line.
pub fn format_documents(docs: &[Document]) -> String {
    if docs.is_empty() {
        return "No documents matched the query.\n".into();
    }
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        let (title, text) = d.title_and_text();
        out.push_str(&format!("Doc {}(Title: {title}) {text}\n", i + 1));
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Row {
        path: String,
        line: usize,
        message: String,
    },
    #[error("retrieval service {url}: {message}")]
    Remote { url: String, message: String },
    #[error("retrieval service: {0}")]
    Http(#[source] HttpError),
}

const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with", "what", "who", "which", "when", "where", "how",
];

/// Lower-cased alphanumeric terms, stop words removed.
pub fn terms(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .filter(|t| !STOP_WORDS.contains(&t.as_str()))
}

/// An in-memory BM25 index.
#[derive(Debug)]
pub struct Bm25Index {
    rows: Vec<Value>,
    /// term → (document, term frequency)
    postings: HashMap<String, Vec<(u32, u32)>>,
    lengths: Vec<u32>,
    average_length: f64,
    k1: f64,
    b: f64,
}

impl Bm25Index {
    /// Indexes `rows` (each needs `contents`, or `title` and `text`).
    pub fn new(rows: Vec<Value>) -> Result<Bm25Index, String> {
        let mut postings: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
        let mut lengths = Vec::with_capacity(rows.len());
        for (d, row) in rows.iter().enumerate() {
            let contents = contents_of(row).ok_or_else(|| {
                format!(
                    "row {} has no \"contents\" (or \"title\" and \"text\")",
                    d + 1
                )
            })?;
            let mut counts: HashMap<String, u32> = HashMap::new();
            let mut length = 0;
            for t in terms(&contents) {
                *counts.entry(t).or_default() += 1;
                length += 1;
            }
            for (t, tf) in counts {
                postings.entry(t).or_default().push((d as u32, tf));
            }
            lengths.push(length);
        }
        let average_length =
            lengths.iter().map(|&l| l as f64).sum::<f64>() / lengths.len().max(1) as f64;
        Ok(Bm25Index {
            rows,
            postings,
            lengths,
            average_length,
            k1: 0.9,
            b: 0.4,
        })
    }

    /// Reads a JSONL corpus; a bad row is named by file and line.
    pub fn from_jsonl(path: &Path) -> Result<Bm25Index, SearchError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SearchError::Io {
            path: shown.clone(),
            source,
        })?;
        let mut rows = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let fail = |message: String| SearchError::Row {
                path: shown.clone(),
                line: i + 1,
                message,
            };
            let row: Value =
                serde_json::from_str(line).map_err(|e| fail(format!("not valid JSON: {e}")))?;
            if contents_of(&row).is_none() {
                return Err(fail(
                    "expected \"contents\" (\"Title\\ntext\"), or \"title\" and \"text\"".into(),
                ));
            }
            rows.push(row);
        }
        Bm25Index::new(rows).map_err(|message| SearchError::Row {
            path: shown,
            line: 0,
            message,
        })
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The `k` best documents for `query`, best first (ties: earlier rows first); documents
    /// sharing no term with the query are not returned.
    pub fn search(&self, query: &str, k: usize) -> Vec<Document> {
        let n = self.rows.len() as f64;
        let mut scores: HashMap<u32, f64> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for term in terms(query) {
            if !seen.insert(term.clone()) {
                continue;
            }
            let Some(list) = self.postings.get(&term) else {
                continue;
            };
            let df = list.len() as f64;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for &(d, tf) in list {
                let tf = tf as f64;
                let norm =
                    1.0 - self.b + self.b * self.lengths[d as usize] as f64 / self.average_length;
                *scores.entry(d).or_default() += idf * tf * (self.k1 + 1.0) / (tf + self.k1 * norm);
            }
        }
        let mut ranked: Vec<(u32, f64)> = scores.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(k)
            .map(|(d, score)| Document {
                row: self.rows[d as usize].clone(),
                score,
            })
            .collect()
    }
}

/// Search-R1's `/retrieve` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetrieveRequest {
    pub queries: Vec<String>,
    #[serde(default)]
    pub topk: Option<usize>,
    #[serde(default)]
    pub return_scores: bool,
}

/// The `/retrieve` answer for `request`.
pub fn retrieve(index: &Bm25Index, request: &RetrieveRequest, default_topk: usize) -> Value {
    let k = request.topk.unwrap_or(default_topk);
    let result: Vec<Value> = request
        .queries
        .iter()
        .map(|q| {
            let docs = index.search(q, k);
            Value::Array(
                docs.into_iter()
                    .map(|d| {
                        if request.return_scores {
                            json!({"document": d.row, "score": d.score})
                        } else {
                            d.row
                        }
                    })
                    .collect(),
            )
        })
        .collect();
    json!({ "result": result })
}

/// The retrieval service: `POST /retrieve`, and `GET /health` with the corpus size.
pub fn router(index: Arc<Bm25Index>, default_topk: usize) -> axum::Router {
    use axum::extract::rejection::JsonRejection;
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::Json;
    let health_index = index.clone();
    axum::Router::new()
        .route(
            "/retrieve",
            post(move |body: Result<Json<RetrieveRequest>, JsonRejection>| async move {
                match body {
                    Ok(Json(request)) => {
                        let index = index.clone();
                        let answer = tokio::task::spawn_blocking(move || {
                            retrieve(&index, &request, default_topk)
                        })
                        .await
                        .expect("invariant: retrieval does not panic");
                        (StatusCode::OK, Json(answer))
                    }
                    Err(e) => (
                        StatusCode::BAD_REQUEST,
                        Json(json!({"error": format!("{e}; expected {{\"queries\": [\"...\"], \"topk\": 3, \"return_scores\": true}}")})),
                    ),
                }
            }),
        )
        .route(
            "/health",
            get(move || async move { Json(json!({"status": "ok", "documents": health_index.len()})) }),
        )
}

/// Where an agent's search goes: the index in this process, or a retrieval service.
#[derive(Debug, Clone)]
pub enum Searcher {
    Local(Arc<Bm25Index>),
    Remote { url: String, timeout: Duration },
}

impl Searcher {
    /// The `k` best documents for each query.
    pub async fn search(
        &self,
        queries: &[String],
        k: usize,
    ) -> Result<Vec<Vec<Document>>, SearchError> {
        match self {
            Searcher::Local(index) => {
                let (index, queries) = (index.clone(), queries.to_vec());
                Ok(tokio::task::spawn_blocking(move || {
                    queries.iter().map(|q| index.search(q, k)).collect()
                })
                .await
                .expect("invariant: retrieval does not panic"))
            }
            Searcher::Remote { url, timeout } => {
                let (url, timeout) = (url.clone(), *timeout);
                let body = RetrieveRequest {
                    queries: queries.to_vec(),
                    topk: Some(k),
                    return_scores: true,
                };
                tokio::task::spawn_blocking(move || remote_search(&url, timeout, &body))
                    .await
                    .expect("invariant: the client does not panic")
            }
        }
    }
}

fn remote_search(
    url: &str,
    timeout: Duration,
    body: &RetrieveRequest,
) -> Result<Vec<Vec<Document>>, SearchError> {
    let fail = |message: String| SearchError::Remote {
        url: url.to_owned(),
        message,
    };
    let value = JsonClient::new(timeout)
        .post(url, None, body)
        .map_err(SearchError::Http)?;
    let lists = value["result"]
        .as_array()
        .ok_or_else(|| fail("the answer has no \"result\" list".into()))?;
    lists
        .iter()
        .map(|list| {
            let items = list
                .as_array()
                .ok_or_else(|| fail("\"result\" must hold one list per query".into()))?;
            Ok(items
                .iter()
                .map(|item| match item.get("document") {
                    Some(doc) => Document {
                        row: if doc.is_string() {
                            json!({ "contents": doc })
                        } else {
                            doc.clone()
                        },
                        score: item["score"].as_f64().unwrap_or(0.0),
                    },
                    None => Document {
                        row: item.clone(),
                        score: 0.0,
                    },
                })
                .collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Bm25Index {
        Bm25Index::new(vec![
            json!({"id": "0", "contents": "\"Paris\"\nParis is the capital of France."}),
            json!({"id": "1", "contents": "\"Jupiter\"\nJupiter is the largest planet of the solar system."}),
            json!({"id": "2", "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."}),
            json!({"id": "3", "contents": "\"Lyon\"\nLyon is a city in France on the Rhone."}),
        ])
        .unwrap()
    }

    #[test]
    fn bm25_ranks_by_term_weight() {
        let index = corpus();
        let hits = index.search("What is the capital of France?", 3);
        assert_eq!(hits[0].row["id"], "0");
        assert_eq!(hits[1].row["id"], "3", "shares only 'france'");
        assert_eq!(
            hits.len(),
            2,
            "documents without a query term are not returned"
        );
        assert!(hits[0].score > hits[1].score);
        assert_eq!(
            index.search("shakespeare", 1)[0].title_and_text().0,
            "Hamlet"
        );
        assert!(index.search("the of is", 3).is_empty(), "stop words only");
        // Hand-computed BM25 for a one-term query: idf · tf(k1+1) / (tf + k1(1 − b + b·dl/avgdl)).
        let hit = &index.search("jupiter", 1)[0];
        let (n, df, tf) = (4.0f64, 1.0, 2.0);
        let lengths = [4.0, 6.0, 6.0, 5.0]; // terms after stop words (titles included)
        let avg = lengths.iter().sum::<f64>() / 4.0;
        let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
        let expect = idf * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * lengths[1] / avg));
        assert!(
            (hit.score - expect).abs() < 1e-9,
            "{} vs {expect}",
            hit.score
        );
    }

    #[test]
    fn observation_format() {
        let index = corpus();
        let text = format_documents(&index.search("capital France", 2));
        assert_eq!(
            text,
            "Doc 1(Title: Paris) Paris is the capital of France.\nDoc 2(Title: Lyon) Lyon is a city in France on the Rhone.\n"
        );
    }
}
