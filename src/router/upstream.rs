//! Calls to engines: the shared pooled HTTP/1 client (`web::client`) with a connect timeout, a deadline
//! for the response head, and, for bodies passed through, an idle timeout between chunks.
//! A failure says whether the request may go to another engine (nothing was sent) or not.

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use std::time::Duration;

/// The pooled client every engine call goes through.
pub type HttpClient = Client<HttpConnector, Body>;

/// Builds the client: `connect` bounds each TCP connect; idle pooled connections are closed
/// after 90 s.
pub fn client(connect: Duration) -> HttpClient {
    crate::web::client::pooled(Some(connect), Duration::from_secs(90), 256)
}

/// Why an engine call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection could not be made (refused, unreachable, connect timeout): nothing
    /// reached the engine, the request may go elsewhere.
    Connect,
    /// No response head within the deadline.
    Timeout,
    /// The connection broke after the request was sent.
    Broken,
    /// A body read whole was larger than its bound (`--max-response-bytes`, the engines'
    /// `/metrics` bound).
    TooLarge,
}

impl Failure {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Broken => "broken",
            Self::TooLarge => "too_large",
        }
    }
}

/// Sends `req` and waits for the response head at most `deadline`.
///
/// # Errors
/// [`Failure`] as it happened.
pub async fn send(
    client: &HttpClient,
    req: hyper::Request<Body>,
    deadline: Duration,
) -> Result<hyper::Response<Incoming>, Failure> {
    match tokio::time::timeout(deadline, client.request(req)).await {
        Err(_) => Err(Failure::Timeout),
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) if e.is_connect() => Err(Failure::Connect),
        Ok(Err(_)) => Err(Failure::Broken),
    }
}

/// Reads a whole body, at most `max` bytes, each chunk within `idle`.
///
/// # Errors
/// [`Failure::Timeout`] on a stalled body, [`Failure::Broken`] on a broken one,
/// [`Failure::TooLarge`] beyond `max`.
pub async fn read_body(mut body: Incoming, max: usize, idle: Duration) -> Result<Bytes, Failure> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(Failure::Timeout),
            Ok(None) => return Ok(Bytes::from(out)),
            Ok(Some(Err(_))) => return Err(Failure::Broken),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if out.len() + data.len() > max {
                        return Err(Failure::TooLarge);
                    }
                    out.extend_from_slice(&data);
                }
            }
        }
    }
}

/// What a passed-through body reports when it ends.
pub trait StreamObserver: Send + 'static {
    /// Each chunk from the engine; returns what goes to the client now (the observer may
    /// hold back a partial event, or drop one).
    fn chunk(&mut self, data: Bytes) -> Bytes;
    /// At the engine's end of body: what the observer still holds, for the client.
    fn finish(&mut self) -> Bytes;
    /// The end: `Ok` when the engine finished the body, the failure otherwise. Also called
    /// (with [`Failure::Broken`]) when the client goes away first.
    fn end(&mut self, result: Result<(), Failure>);
}

struct Passing<O: StreamObserver> {
    body: Incoming,
    observer: O,
    idle: Duration,
    ended: bool,
}

impl<O: StreamObserver> Drop for Passing<O> {
    fn drop(&mut self) {
        if !self.ended {
            self.observer.end(Err(Failure::Broken));
        }
    }
}

/// The engine's body passed to the client chunk by chunk as it arrives, each chunk within
/// `idle` (a stalled engine ends the stream; the client sees it cut).
pub fn pass_through<O: StreamObserver>(body: Incoming, observer: O, idle: Duration) -> Body {
    let state = Passing {
        body,
        observer,
        idle,
        ended: false,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        match tokio::time::timeout(st.idle, st.body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let data = st.observer.chunk(frame.into_data().unwrap_or_default());
                Some((Ok::<Bytes, std::io::Error>(data), st))
            }
            Ok(None) => {
                st.ended = true;
                let tail = st.observer.finish();
                st.observer.end(Ok(()));
                (!tail.is_empty()).then_some((Ok(tail), st))
            }
            Ok(Some(Err(e))) => {
                st.ended = true;
                st.observer.end(Err(Failure::Broken));
                Some((Err(std::io::Error::other(e)), st))
            }
            Err(_) => {
                st.ended = true;
                st.observer.end(Err(Failure::Timeout));
                Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "engine stalled",
                    )),
                    st,
                ))
            }
        }
    });
    Body::from_stream(stream)
}
