//! The one response body type the server hands to hyper.
//!
//! A single concrete type (instead of boxed trait objects) keeps the common
//! full-body path allocation-free, and lets every response carry the
//! `InFlight` guard so `/mock/stats` counts a request as running until its
//! last byte is written or the client leaves.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::knobs::Abort;
use crate::sse::SseStream;
use crate::state::InFlight;

pub struct MockBody {
    kind: Kind,
    /// Held only for its `Drop`.
    _in_flight: Option<InFlight>,
}

enum Kind {
    Full(Option<Bytes>),
    /// A full body sent only after the sleep: the header goes out first.
    Delayed(Pin<Box<tokio::time::Sleep>>, Option<Bytes>),
    Sse(Box<SseStream>),
    /// A whole body sent chunked, after which the body never ends (`x-mock-after-done: hold`).
    ThenHold(Option<Bytes>, Pin<Box<tokio::time::Sleep>>),
}

impl MockBody {
    /// A complete body; hyper sends it with `Content-Length`.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        let data = (!data.is_empty()).then_some(data);
        Self { kind: Kind::Full(data), _in_flight: None }
    }

    /// A complete body (with `Content-Length`) whose bytes follow the header after `delay`.
    pub fn delayed(data: impl Into<Bytes>, delay: std::time::Duration) -> Self {
        let data: Bytes = data.into();
        Self { kind: Kind::Delayed(Box::pin(tokio::time::sleep(delay)), Some(data)), _in_flight: None }
    }

    /// `data`, then a body that stays open for an hour (sent chunked: the length is unknown).
    pub fn then_hold(data: impl Into<Bytes>) -> Self {
        let sleep = Box::pin(tokio::time::sleep(std::time::Duration::from_secs(3600)));
        Self { kind: Kind::ThenHold(Some(data.into()), sleep), _in_flight: None }
    }

    /// A generated event stream; hyper sends it chunked.
    pub fn sse(stream: SseStream) -> Self {
        Self { kind: Kind::Sse(Box::new(stream)), _in_flight: None }
    }

    /// Ties the request's in-flight guard to the body's lifetime.
    pub fn with_in_flight(mut self, guard: InFlight) -> Self {
        self._in_flight = Some(guard);
        self
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Abort;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Abort>>> {
        match &mut self.get_mut().kind {
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Delayed(sleep, data) => match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
                Poll::Pending => Poll::Pending,
            },
            Kind::Sse(stream) => stream.poll_next(cx),
            Kind::ThenHold(data, sleep) => match data.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => sleep.as_mut().poll(cx).map(|()| None),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(data) | Kind::Delayed(_, data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Sse(_) | Kind::ThenHold(..) => SizeHint::default(),
        }
    }
}
