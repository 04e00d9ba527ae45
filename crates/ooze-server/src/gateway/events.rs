//! Streamed replies as named server-sent events (`event: NAME` + `data: JSON`), the form of
//! Anthropic's Messages and OpenAI's Responses streams, shared by [`super::messages`] and
//! [`super::responses`].
//!
//! - **Opening late.** The HTTP response starts when the call's first token arrives (or the call
//!   ends without one), not when the request does: a call refused before generating (a spent
//!   budget, a prompt over the context length) is an HTTP error in the API's shape, as it would
//!   be without streaming, rather than an error event inside a 200 stream.
//! - **Nothing dropped.** Events go through an unbounded queue: the SDKs rebuild the final message
//!   from the deltas, so a slow reader must get every one (a turn's events are bounded by its
//!   tokens).
//! - **Text pieces.** [`Pieces`] hands out the turn's text as it becomes safe to show: nothing
//!   of a `<tool_call>` block, and, when the chat has tools, no trailing whitespace until more text
//!   follows (a reply's content before its tool calls is trimmed), so the deltas add up to the
//!   reply's content.

use crate::error::ApiError;
use crate::text_stream::TextStream;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use ooze_model::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use tokio::sync::{mpsc, oneshot};

type Queue = mpsc::UnboundedReceiver<Result<SseEvent, Infallible>>;

/// The sending side of a streamed reply.
pub struct Events {
    tx: mpsc::UnboundedSender<Result<SseEvent, Infallible>>,
    /// Until the response opens: how to open it, or answer with an error instead.
    opening: Option<oneshot::Sender<Result<(), ApiError>>>,
    /// The next `sequence_number`, for APIs that number their events.
    sequence: Option<u64>,
}

/// The receiving side: becomes the HTTP response once [`Events`] opens it.
pub struct Opening {
    rx: Queue,
    opened: oneshot::Receiver<Result<(), ApiError>>,
}

impl Events {
    /// A stream of events; with `numbered`, each event's data gets a `sequence_number` from 0.
    pub fn new(numbered: bool) -> (Events, Opening) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (open_tx, opened) = oneshot::channel();
        let events = Events {
            tx,
            opening: Some(open_tx),
            sequence: numbered.then_some(0),
        };
        (events, Opening { rx, opened })
    }

    /// Whether the response has started.
    pub fn is_open(&self) -> bool {
        self.opening.is_none()
    }

    /// Starts the response (200, `text/event-stream`): the events queued so far go out first.
    pub fn open(&mut self) {
        if let Some(opening) = self.opening.take() {
            let _ = opening.send(Ok(()));
        }
    }

    /// Queues event `name` with `data`; false once the client is gone.
    pub fn send(&mut self, name: &str, mut data: Value) -> bool {
        if let Some(n) = self.sequence.as_mut() {
            data["sequence_number"] = json!(*n);
            *n += 1;
        }
        let event = SseEvent::default().event(name).data(data.to_string());
        self.tx.send(Ok(event)).is_ok()
    }

    /// Whether the client has gone (the call should stop generating).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Ends the stream with `error`: before the response opened, the response is that error
    /// (`None` comes back); after, the error comes back for the caller to send as its API's
    /// error event.
    pub fn refuse(&mut self, error: ApiError) -> Option<ApiError> {
        match self.opening.take() {
            Some(opening) => {
                let _ = opening.send(Err(error));
                None
            }
            None => Some(error),
        }
    }
}

impl Opening {
    /// The HTTP response, once the stream opens or is refused.
    pub async fn response(self) -> Result<Response, ApiError> {
        match self.opened.await {
            Ok(Ok(())) => {
                let events = tokio_stream::wrappers::UnboundedReceiverStream::new(self.rx);
                Ok(Sse::new(events).into_response())
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(ApiError {
                code: "internal",
                message: "the stream ended before it started".into(),
            }),
        }
    }
}

/// A streamed turn's text in pieces that are safe to show (see the module header).
pub struct Pieces {
    text: TextStream,
    /// Trailing whitespace not shown yet (with tools only).
    held: String,
    /// Everything shown so far.
    sent: String,
    has_tools: bool,
}

impl Pieces {
    /// Pieces of a turn generated with tools (`has_tools`) or without.
    pub fn new(has_tools: bool) -> Pieces {
        Pieces {
            text: TextStream::new(true, has_tools),
            held: String::new(),
            sent: String::new(),
            has_tools,
        }
    }

    /// Adds a token; returns the text that became safe to show (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> String {
        let piece = self.text.push(tokenizer, token);
        let shown = if self.has_tools {
            self.held.push_str(&piece);
            let keep = self.held.trim_end().len();
            self.held.drain(..keep).collect()
        } else {
            piece
        };
        self.sent.push_str(&shown);
        shown
    }

    /// What is left to show of the reply's `content` (its text before any tool call, trimmed,
    /// when it called tools; all of it otherwise). Empty if the pieces shown are not its start
    /// (a detokenisation the whole text does not repeat; the final event still carries it).
    pub fn rest(&mut self, content: &str) -> String {
        let rest = content
            .strip_prefix(self.sent.as_str())
            .unwrap_or("")
            .to_owned();
        self.sent.push_str(&rest);
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text_stream::tests::tokenizer;

    #[test]
    fn pieces_with_tools_add_up_to_the_trimmed_content() {
        let tok = tokenizer();
        let text = "Let me check. \n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        let mut pieces = Pieces::new(true);
        let shown: String = tok
            .encode(text, false)
            .unwrap()
            .iter()
            .map(|&t| pieces.push(&tok, t))
            .collect();
        assert_eq!(shown, "Let me check.");
        let content = crate::tool_calls::parse(text, "c").content;
        assert_eq!(shown, content);
        assert_eq!(pieces.rest(&content), "");
    }

    #[test]
    fn pieces_without_a_tool_call_give_all_the_text() {
        let tok = tokenizer();
        let text = "Paris, \n  then Oslo.\n ";
        for has_tools in [true, false] {
            let mut pieces = Pieces::new(has_tools);
            let mut shown: String = tok
                .encode(text, false)
                .unwrap()
                .iter()
                .map(|&t| pieces.push(&tok, t))
                .collect();
            shown.push_str(&pieces.rest(text));
            assert_eq!(shown, text, "has_tools {has_tools}");
        }
    }

    #[tokio::test]
    async fn a_refused_stream_is_the_error_and_an_open_one_numbers_its_events() {
        let (mut events, opening) = Events::new(true);
        let refused = events.refuse(ApiError::invalid("too long"));
        assert!(refused.is_none());
        assert_eq!(opening.response().await.unwrap_err().message, "too long");

        let (mut events, opening) = Events::new(true);
        assert!(events.send("a", json!({})));
        events.open();
        assert!(events.is_open());
        let response = opening.response().await.unwrap();
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "an SSE response"
        );
        assert!(events.send("b", json!({"x": 1})));
        assert_eq!(
            events.refuse(ApiError::invalid("late")).unwrap().message,
            "late"
        );
        drop(events);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert_eq!(
            body,
            "event: a\ndata: {\"sequence_number\":0}\n\nevent: b\ndata: {\"x\":1,\"sequence_number\":1}\n\n"
        );
    }
}
