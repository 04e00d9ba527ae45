//! The one blocking HTTP client of ooze's outbound JSON calls: helper models on OpenAI-compatible
//! servers, remote reward models, retrieval services, `GET /models`. A [`JsonClient`] has one
//! timeout for the whole call (connect, send, answer); every error names the method, the URL and,
//! for an answer that is not a success, its status and the start of its body.
//!
//! Blocking (ureq): callers on the async runtime run it on a blocking thread.

use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

/// Characters of an answer's body kept in an error message.
const BODY_IN_ERRORS: usize = 300;

/// A JSON-over-HTTP client with a timeout per call. Cloning shares its connections.
#[derive(Debug, Clone)]
pub struct JsonClient {
    agent: ureq::Agent,
}

/// Why an HTTP call gave no usable answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HttpError {
    /// No answer: the connection, the request or the timeout failed.
    #[error("{method} {url}: {message}")]
    Transport {
        method: &'static str,
        url: String,
        message: String,
    },
    #[error("{method} {url}: reading the answer: {message}")]
    Read {
        method: &'static str,
        url: String,
        message: String,
    },
    /// An answer whose status is not a success.
    #[error("{method} {url}: HTTP {status}: {body}")]
    Status {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    #[error("{method} {url}: the answer is not JSON ({message}): {body}")]
    NotJson {
        method: &'static str,
        url: String,
        message: String,
        body: String,
    },
}

impl HttpError {
    /// The status of an answer that was not a success.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The start of `body`, for error messages.
fn excerpt(body: &str) -> String {
    let mut cut: String = body.chars().take(BODY_IN_ERRORS).collect();
    if cut.len() < body.len() {
        cut.push('…');
    }
    cut
}

impl JsonClient {
    /// A client whose calls each end after `timeout`.
    pub fn new(timeout: Duration) -> JsonClient {
        JsonClient {
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                .http_status_as_error(false)
                .build()
                .new_agent(),
        }
    }

    /// POSTs `body` as JSON (with `Authorization: Bearer {bearer}` when given) and returns the
    /// answer's text once its status is a success.
    pub fn post_text(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: &impl Serialize,
    ) -> Result<String, HttpError> {
        let mut request = self.agent.post(url);
        if let Some(key) = bearer {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        let answer = request.send_json(body);
        read_answer("POST", url, answer)
    }

    /// [`post_text`](Self::post_text), the answer parsed as JSON.
    pub fn post(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: &impl Serialize,
    ) -> Result<Value, HttpError> {
        let text = self.post_text(url, bearer, body)?;
        parse_json("POST", url, &text)
    }

    /// GETs `url` and parses the answer as JSON once its status is a success.
    pub fn get(&self, url: &str, bearer: Option<&str>) -> Result<Value, HttpError> {
        let mut request = self.agent.get(url);
        if let Some(key) = bearer {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        let text = read_answer("GET", url, request.call())?;
        parse_json("GET", url, &text)
    }
}

fn read_answer(
    method: &'static str,
    url: &str,
    answer: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<String, HttpError> {
    let mut response = answer.map_err(|e| HttpError::Transport {
        method,
        url: url.to_owned(),
        message: e.to_string(),
    })?;
    let status = response.status();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| HttpError::Read {
            method,
            url: url.to_owned(),
            message: e.to_string(),
        })?;
    if !status.is_success() {
        return Err(HttpError::Status {
            method,
            url: url.to_owned(),
            status: status.as_u16(),
            body: excerpt(&text),
        });
    }
    Ok(text)
}

fn parse_json(method: &'static str, url: &str, text: &str) -> Result<Value, HttpError> {
    serde_json::from_str(text).map_err(|e| HttpError::NotJson {
        method,
        url: url.to_owned(),
        message: e.to_string(),
        body: excerpt(text),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    /// A server that answers each connection with the next of `answers` (status, body) and
    /// records the requests' first line and `Authorization` header.
    fn serve(answers: Vec<(u16, &'static str)>) -> (String, std::sync::mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (status, body) in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut seen = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    let line = line.trim_end().to_owned();
                    if line.is_empty() {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(n) = lower.strip_prefix("content-length:") {
                        length = n.trim().parse().unwrap();
                    }
                    if seen.is_empty() || lower.starts_with("authorization:") {
                        seen.push_str(&line);
                        seen.push('|');
                    }
                }
                let mut request_body = vec![0; length];
                reader.read_exact(&mut request_body).unwrap();
                seen.push_str(&String::from_utf8(request_body).unwrap());
                tx.send(seen).unwrap();
                let mut stream = stream;
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        (url, rx)
    }

    #[test]
    fn posts_and_gets_json() {
        let (url, seen) = serve(vec![(200, r#"{"ok": 1}"#), (200, r#"{"data": []}"#)]);
        let client = JsonClient::new(Duration::from_secs(5));
        let answer = client
            .post(&format!("{url}/x"), Some("k"), &json!({"a": 2}))
            .unwrap();
        assert_eq!(answer, json!({"ok": 1}));
        let request = seen.recv().unwrap();
        assert!(request.starts_with("POST /x HTTP/1.1|"), "{request}");
        assert!(request.contains("Bearer k"), "{request}");
        let sent: Value = serde_json::from_str(request.rsplit('|').next().unwrap()).unwrap();
        assert_eq!(sent, json!({"a": 2}));
        assert_eq!(
            client.get(&format!("{url}/models"), None).unwrap(),
            json!({"data": []})
        );
        assert!(seen.recv().unwrap().starts_with("GET /models HTTP/1.1|"));
    }

    #[test]
    fn errors_name_the_url_and_the_status() {
        let (url, _seen) = serve(vec![(503, "busy"), (200, "not json")]);
        let client = JsonClient::new(Duration::from_secs(5));
        let target = format!("{url}/score");
        let e = client.post(&target, None, &json!({})).unwrap_err();
        assert_eq!(e.status(), Some(503));
        assert_eq!(e.to_string(), format!("POST {target}: HTTP 503: busy"));
        let e = client.get(&target, None).unwrap_err();
        assert_eq!(e.status(), None);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("GET {target}: the answer is not JSON ("))
                && text.ends_with("): not json"),
            "{text}"
        );
        // Nothing listens here any more.
        let e = client.get("http://127.0.0.1:1/models", None).unwrap_err();
        assert!(matches!(e, HttpError::Transport { .. }), "{e:?}");
        assert!(e.to_string().starts_with("GET http://127.0.0.1:1/models: "));
    }

    #[test]
    fn long_bodies_are_cut_in_errors() {
        let body = "x".repeat(1000);
        assert_eq!(excerpt(&body).chars().count(), BODY_IN_ERRORS + 1);
        assert_eq!(excerpt("short"), "short");
    }
}
