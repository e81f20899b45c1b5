//! Server-sent events for every streaming route: a task turns engine events into frames through
//! the route's [`Frames`]; dropping the body (the client left) ends the task, which drops the
//! engine receivers, which cancels the generation.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde::Serialize;
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

/// How long a stream may be silent before it sends a keep-alive comment.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(200);

/// A route's streamed body, event by event.
pub trait Frames: Send + 'static {
    type Event: Send + 'static;
    /// What goes out with the engine's first event (its admission).
    fn opening(&mut self) -> Vec<Bytes>;
    /// The frames for one event; `Err` (the message to send) when the event is the generation
    /// failing.
    fn event(&mut self, ev: Self::Event) -> Result<Vec<Bytes>, String>;
    /// The frames that end a failed stream.
    fn failure(&self, message: &str) -> Vec<Bytes>;
    /// Work to finish before the closing frames go out (a stored response is written before the
    /// client learns its id is complete). None by default.
    fn finish(&mut self) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        None
    }
    /// The frames that end a finished stream.
    fn closing(&mut self) -> Vec<Bytes>;
    fn done(&self) -> bool;
}

/// One `data:` frame of JSON. The bodies hold only strings, numbers and lists, which always
/// serialise.
pub fn data<T: Serialize>(v: &T) -> Bytes {
    let json = serde_json::to_string(v).unwrap_or_default();
    Bytes::from(format!("data: {json}\n\n"))
}

/// OpenAI's end-of-stream marker.
pub const DONE: Bytes = Bytes::from_static(b"data: [DONE]\n\n");

/// The body of an OpenAI-style error inside a stream (the status line has already gone out).
pub fn openai_error(message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"message": message, "type": "InternalServerError", "param": null, "code": 500}})
}

/// Streams `frames` over `rx` as `text/event-stream`. The permit is held until the stream ends.
pub fn respond<F: Frames>(
    mut frames: F,
    mut rx: UnboundedReceiver<F::Event>,
    permit: crate::limiter::Permit,
) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let _permit = permit;
        let mut opened = false;
        // One timer for the whole stream, pushed back at every event (not a new one per token).
        let silence = tokio::time::sleep(KEEP_ALIVE);
        tokio::pin!(silence);
        while !frames.done() {
            // While nothing comes (queued, or a long prefill), an SSE comment every
            // KEEP_ALIVE: writing is how the server learns that the client has gone (hyper
            // notices a closed connection only on a write), so a request abandoned while it
            // waits is dropped before the engine admits it. Clients skip comment lines.
            let next = tokio::select! {
                ev = rx.recv() => ev,
                _ = &mut silence => {
                    silence.as_mut().reset(tokio::time::Instant::now() + KEEP_ALIVE);
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            silence.as_mut().reset(tokio::time::Instant::now() + KEEP_ALIVE);
            // The opening frames go out with the engine's first event (its admission), as vLLM
            // sends its first chunk with the first output: a client that reads one chunk and
            // leaves has then been admitted, and its sequence is freed at its next token.
            let mut batch = if opened { Vec::new() } else { frames.opening() };
            opened = true;
            let step = match next {
                Some(ev) => frames.event(ev),
                None => Err("the inference engine stopped during generation".to_string()),
            };
            let failed = match step {
                Ok(more) => {
                    batch.extend(more);
                    false
                }
                Err(message) => {
                    batch.extend(frames.failure(&message));
                    true
                }
            };
            for frame in batch {
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
            if failed {
                return;
            }
        }
        if let Some(work) = frames.finish() {
            work.await;
        }
        for frame in frames.closing() {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(ReceiverStream { rx: out });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// A bounded receiver as a body stream.
struct ReceiverStream {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl futures_core::Stream for ReceiverStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}
