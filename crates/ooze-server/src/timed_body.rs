//! A request body with a deadline: the whole body must arrive within the body read timeout of the
//! request head, or reading it fails with [`BodyTimeout`]. hyper has no body timeout of its own, so
//! a client that sends its headers and then stops (or trickles a byte a minute) would hold a
//! connection and a handler forever; the extractors that read the body see the error instead, and
//! [`crate::error::ApiError`] turns it into a 408.
//!
//! The deadline is total, not per chunk: a trickle of tiny chunks cannot keep it alive.

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The body did not arrive in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimeout(pub Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {:?} of its headers",
            self.0
        )
    }
}

impl std::error::Error for BodyTimeout {}

/// `inner` with a deadline `limit` from now.
pub struct TimedBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl TimedBody {
    pub fn new(inner: Body, limit: Duration) -> TimedBody {
        TimedBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(axum::BoxError::from)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(this.limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `err` or anything in its source chain is a [`BodyTimeout`].
pub fn caused_by_timeout(err: &(dyn std::error::Error + 'static)) -> Option<BodyTimeout> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(timeout) = err.downcast_ref::<BodyTimeout>() {
            return Some(*timeout);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    #[tokio::test]
    async fn a_complete_body_passes_through() {
        let body = Body::new(TimedBody::new(Body::from("hello"), Duration::from_secs(60)));
        assert_eq!(to_bytes(body, 1024).await.unwrap(), "hello");
    }

    #[tokio::test]
    async fn a_body_that_never_ends_fails_with_the_timeout() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from_static(b"{\"a\""))).await.unwrap();
        let stalled = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let limit = Duration::from_millis(50);
        let body = Body::new(TimedBody::new(stalled, limit));
        let err = to_bytes(body, 1024).await.unwrap_err();
        assert_eq!(caused_by_timeout(&err), Some(BodyTimeout(limit)), "{err}");
        drop(tx);
    }
}
