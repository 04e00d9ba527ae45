//! The accept loop: a router served over TCP with limits that hold under hostile load, and a
//! graceful shutdown.
//!
//! `axum::serve` builds hyper-util's connection builder itself, with no timer and no way to set
//! one, so hyper's header read timeout cannot be turned on through it; this loop drives hyper's
//! HTTP/1 connections directly (HTTP/1 only, as the workspace builds axum).
//!
//! - **Header read timeout** (hyper's own, with [`TokioTimer`]): a client that sends half a request
//!   head and stops, or sits idle between keep-alive requests, is closed after it.
//! - **Body read timeout** ([`TimedBody`]): a request's whole body must arrive within it of its
//!   head; the extractor reading it fails and the client gets a 408.
//! - **Connection cap**: a semaphore of `max_connections` permits, one per open connection. A
//!   connection over the cap is answered at once with a 503 in the one error shape and closed, so a
//!   flood neither runs the process out of file descriptors nor leaves `/health` queued behind it.
//! - **Graceful shutdown** in three [`Phase`]s driven by a [`Shutdown`] handle. *Serving*.
//!   *Draining* (the first trigger): idle keep-alive connections are closed, every new request gets
//!   a 503 (`unavailable`, with `connection: close`), running requests may finish. *Aborting* (a
//!   second trigger, or the drain period running out, or every connection closing): the caller's
//!   abort hook ends every running generation, so open streams send their last event (finish
//!   reason `abort`) and `[DONE]`; the listener closes, and the loop returns once every connection
//!   has closed or [`FLUSH_GRACE`] has passed, whichever is first.

use crate::error::ApiError;
use crate::timed_body::TimedBody;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{HeaderValue, CONNECTION};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Limits for [`serve`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// A request head (or, on a kept-alive connection, the next one) must arrive within this.
    pub header_read_timeout: Duration,
    /// A request body must arrive within this of its head.
    pub body_read_timeout: Duration,
    /// Connections open at once; more are answered with a 503 and closed.
    pub max_connections: usize,
    /// After the first shutdown trigger, running requests may finish for this long.
    pub shutdown_drain: Duration,
}

impl Default for ServeConfig {
    fn default() -> ServeConfig {
        ServeConfig {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            shutdown_drain: Duration::from_secs(20),
        }
    }
}

/// Where a server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Serving,
    /// New requests get 503; running ones may finish.
    Draining,
    /// Running requests are aborted; the server exits once their last events are written.
    Aborting,
}

/// Asks a server started with [`serve`] to stop. Clones share one state; it may be triggered
/// before or while the server runs.
#[derive(Debug, Clone)]
pub struct Shutdown {
    phase: Arc<watch::Sender<Phase>>,
}

impl Default for Shutdown {
    fn default() -> Shutdown {
        Shutdown::new()
    }
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown {
            phase: Arc::new(watch::Sender::new(Phase::Serving)),
        }
    }

    /// The first call starts draining; any later call aborts. Returns the phase it moved to.
    pub fn trigger(&self) -> Phase {
        let mut now = Phase::Aborting;
        self.phase.send_modify(|phase| {
            if *phase == Phase::Serving {
                now = Phase::Draining;
            }
            *phase = now;
        });
        now
    }

    /// Skips (or ends) the drain: running requests are aborted now.
    pub fn abort(&self) {
        self.phase.send_replace(Phase::Aborting);
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }
}

/// How long the aborted requests' last events have to be written once the drain is over.
pub const FLUSH_GRACE: Duration = Duration::from_secs(5);
/// Refused connections lingering until their client has read the 503; beyond this a refused
/// connection gets its 503 without the wait ([`refuse_now`]).
const MAX_REFUSING: usize = 1024;
/// How long a refused connection may take to read its 503.
const REFUSE_LINGER: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `shutdown` has run its course (see the module header);
/// `abort` ends every running request (it is called once, when the drain is over).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: &ServeConfig,
    shutdown: &Shutdown,
    abort: impl FnOnce(),
) -> std::io::Result<()> {
    if config.max_connections == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "max_connections: must be at least 1",
        ));
    }
    let mut phase = shutdown.subscribe();
    let guard = Arc::new(Guard {
        phase: phase.clone(),
        body_read_timeout: config.body_read_timeout,
    });
    let app = app.layer(axum::middleware::from_fn_with_state(guard, guard_request));
    let mut conns = Connections::new(app, config, phase.clone());

    tokio::select! {
        never = conns.accept_forever(&listener) => match never {},
        _ = phase.wait_for(|p| *p != Phase::Serving) => {}
    }
    if *phase.borrow() == Phase::Draining {
        eprintln!(
            "ooze-server: draining for up to {:?} ({} connection(s) open; new requests get 503)",
            config.shutdown_drain,
            conns.tasks.len()
        );
        tokio::select! {
            () = conns.accept_until_idle(&listener) => {}
            () = tokio::time::sleep(config.shutdown_drain) => {}
            _ = phase.wait_for(|p| *p == Phase::Aborting) => {}
        }
    }
    shutdown.abort();
    drop(listener);
    abort();
    if tokio::time::timeout(FLUSH_GRACE, conns.all_closed())
        .await
        .is_err()
    {
        eprintln!(
            "ooze-server: {} connection(s) still open after {FLUSH_GRACE:?}; closing them",
            conns.tasks.len()
        );
    }
    Ok(())
}

/// What every request passes through first.
struct Guard {
    phase: watch::Receiver<Phase>,
    body_read_timeout: Duration,
}

/// 503 once the server is shutting down; otherwise the body gets its deadline.
async fn guard_request(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if *guard.phase.borrow() != Phase::Serving {
        let mut response = ApiError {
            code: "unavailable",
            message: "the server is shutting down".into(),
        }
        .into_response();
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    let limit = guard.body_read_timeout;
    next.run(request.map(|body| Body::new(TimedBody::new(body, limit))))
        .await
}

/// The open connections: one task each, in one set so none outlives [`serve`].
struct Connections {
    app: Router,
    http: http1::Builder,
    permits: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    refusal: Arc<[u8]>,
    phase: watch::Receiver<Phase>,
    tasks: JoinSet<()>,
    /// Whether a refusal has been logged since the last connection was admitted.
    refusal_logged: bool,
}

impl Connections {
    fn new(app: Router, config: &ServeConfig, phase: watch::Receiver<Phase>) -> Connections {
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout);
        let refusal = ApiError {
            code: "unavailable",
            message: format!(
                "the server has {} connections open, its limit; retry later",
                config.max_connections
            ),
        }
        .raw_response();
        Connections {
            app,
            http,
            permits: Arc::new(Semaphore::new(config.max_connections)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            refusal: refusal.into(),
            phase,
            tasks: JoinSet::new(),
            refusal_logged: false,
        }
    }

    async fn accept_forever(&mut self, listener: &TcpListener) -> Infallible {
        loop {
            self.step(listener).await;
        }
    }

    /// Accepts (new requests get 503 from the guard) until no connection is open.
    async fn accept_until_idle(&mut self, listener: &TcpListener) {
        while !self.tasks.is_empty() {
            self.step(listener).await;
        }
    }

    async fn all_closed(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }

    /// Accepts one connection or reaps one finished task.
    async fn step(&mut self, listener: &TcpListener) {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => self.admit(stream),
                // The peer gave up before the accept: nothing wrong with the listener.
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionRefused
                ) => {}
                // EMFILE and the like: wait for connections to close rather than spin.
                Err(e) => {
                    eprintln!("ooze-server: accept failed: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
        }
    }

    fn admit(&mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.refusal_logged = false;
                let conn = serve_connection(
                    self.http.clone(),
                    stream,
                    self.app.clone(),
                    self.phase.clone(),
                    permit,
                );
                self.tasks.spawn(conn);
            }
            Err(_) => {
                if !self.refusal_logged {
                    eprintln!(
                        "ooze-server: connection limit reached; refusing new connections with 503"
                    );
                    self.refusal_logged = true;
                }
                match self.refusing.clone().try_acquire_owned() {
                    Ok(permit) => {
                        self.tasks
                            .spawn(refuse(stream, self.refusal.clone(), permit));
                    }
                    // A flood holds every lingering refusal: answer without waiting.
                    Err(_) => refuse_now(stream, &self.refusal),
                }
            }
        }
    }
}

async fn serve_connection(
    http: http1::Builder,
    stream: TcpStream,
    app: Router,
    mut phase: watch::Receiver<Phase>,
    _permit: OwnedSemaphorePermit,
) {
    let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    // Connections accepted while draining are not shut down here: their request is answered
    // with a 503 that closes them.
    if *phase.borrow_and_update() == Phase::Serving {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = phase.wait_for(|p| *p != Phase::Serving) => conn.as_mut().graceful_shutdown(),
        }
    }
    let _ = conn.await;
}

/// Writes the 503 and closes the write side, then reads what the client sent until it closes,
/// so the close is a FIN after the response rather than a reset that could discard it.
async fn refuse(mut stream: TcpStream, response: Arc<[u8]>, _permit: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(REFUSE_LINGER, async {
        stream.write_all(&response).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    })
    .await;
}

/// The 503 without waiting: written if the socket takes it now, then what the client already sent
/// is read off so that the close is a FIN (a reset could discard the 503 unread).
fn refuse_now(stream: TcpStream, response: &[u8]) {
    let _ = stream.try_write(response);
    let mut sink = [0u8; 4096];
    while matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {}
}
