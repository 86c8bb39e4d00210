//! The plugin contract. The core runs an ordered chain of plugins at each phase of a
//! request; it knows this trait, never a concrete plugin (the chain is assembled from config
//! in `plugins/mod.rs`). Every hook has a no-op default, so a plugin implements only the
//! phases it works in. Request phases run by priority (higher first) and may stop the chain;
//! response phases run in the reverse order; the log phase runs every plugin.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::FutureExt;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::{Map, Value};

use crate::config::ModelEntry;
use crate::http::error::GatewayError;
use crate::proxy::ctx::RequestCtx;

/// What a request phase decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    /// Go on to the next plugin and then upstream.
    Continue,
    /// Go on, and send the replica this body: the request as the dialect's serving path
    /// rewrote it (the request phase's result; the last one given wins). Meaningless from
    /// the headers phase, where no body has been read.
    Forward(Bytes),
    /// A response was already written (for example a replay); stop here.
    Handled,
}

#[async_trait]
pub trait Plugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// Higher runs first. The composition root lists the order in one place (in this
    /// project, `CHAIN_ORDER` in `plugins/mod.rs`, pinned by a test).
    fn priority(&self) -> i16;

    /// After the route is known, before any body is read (gate, authentication, limits).
    async fn on_request_headers(&self, _session: &mut Session, _cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// The name of this plugin's `on_request` phase as a span of a traced request (e.g.
    /// `admission`); `None`: not a span of its own (decision 215).
    fn request_span(&self) -> Option<&'static str> {
        None
    }

    /// After the body is read and the model resolved, before placement. The serving path of
    /// the request's dialect validates here and returns `Flow::Forward` with the body for the
    /// replica.
    async fn on_request(&self, _session: &mut Session, _cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// A final 2xx response header from the replica, before it goes to the client.
    fn on_response_header(&self, _resp: &mut ResponseHeader, _cx: &mut RequestCtx) -> Result<(), GatewayError> {
        Ok(())
    }

    /// Each chunk of a 2xx response body. CPU work only (Pingora's body filters are sync).
    fn on_response_chunk(
        &self,
        _body: &mut Option<Bytes>,
        _end_of_stream: bool,
        _cx: &mut RequestCtx,
    ) -> Result<(), GatewayError> {
        Ok(())
    }

    /// The error frame that ends a stream the core closes after a failure (a replica reset,
    /// a timeout): a plugin that translates the stream returns it in its own grammar. `None`:
    /// the core writes the route's envelope frame.
    fn stream_failure_frame(&self, _err: &GatewayError, _cx: &mut RequestCtx) -> Option<Bytes> {
        None
    }

    /// Once per request, on every path (success, refusal, failure, client gone).
    async fn on_log(&self, _cx: &mut RequestCtx) {}

    /// Add the values this plugin enforces to a model object of `GET /v1/models` (the caller
    /// is `cx.principal`), so what is published is what the gates apply.
    fn describe_model(&self, _model: &ModelEntry, _object: &mut Map<String, Value>, _cx: &RequestCtx) {}
}

/// The plugins of one server, sorted by priority.
#[derive(Clone, Default)]
pub struct Chain {
    plugins: Vec<Arc<dyn Plugin>>,
}

impl Chain {
    pub fn new(mut plugins: Vec<Arc<dyn Plugin>>) -> Self {
        // Stable: equal priorities keep the order of the config.
        plugins.sort_by_key(|p| std::cmp::Reverse(p.priority()));
        Chain { plugins }
    }

    pub fn names(&self) -> Vec<(&'static str, i16)> {
        self.plugins.iter().map(|p| (p.name(), p.priority())).collect()
    }

    pub async fn on_request_headers(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        for p in &self.plugins {
            if p.on_request_headers(s, cx).await? == Flow::Handled {
                return Ok(Flow::Handled);
            }
        }
        Ok(Flow::Continue)
    }

    /// `Handled` as soon as a plugin answered; else `Forward` with the last body a plugin gave
    /// (`Continue` when none did).
    pub async fn on_request(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        let mut forward = None;
        // A sampled request times the phases that are spans of their own.
        let traced = cx.trace.as_ref().is_some_and(|t| t.sampled);
        for p in &self.plugins {
            let span = if traced { p.request_span() } else { None };
            let started = span.map(|_| std::time::SystemTime::now());
            let flow = p.on_request(s, cx).await;
            if let (Some(name), Some(start), Some(trace)) = (span, started, cx.trace.as_mut()) {
                trace.phases.push((name, start, std::time::SystemTime::now()));
            }
            match flow? {
                Flow::Handled => return Ok(Flow::Handled),
                Flow::Forward(body) => forward = Some(body),
                Flow::Continue => {}
            }
        }
        Ok(forward.map_or(Flow::Continue, Flow::Forward))
    }

    /// Response phases run in the reverse order (an onion): the plugin nearest the replica
    /// sees its bytes first, so a dialect translator (higher priority than the chat path)
    /// translates what the chat path has already normalised.
    pub fn on_response_header(&self, resp: &mut ResponseHeader, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        self.plugins.iter().rev().try_for_each(|p| p.on_response_header(resp, cx))
    }

    /// The first plugin's frame for a stream failure, in response order.
    pub fn stream_failure_frame(&self, err: &GatewayError, cx: &mut RequestCtx) -> Option<Bytes> {
        self.plugins.iter().rev().find_map(|p| p.stream_failure_frame(err, cx))
    }

    pub fn on_response_chunk(
        &self,
        body: &mut Option<Bytes>,
        eos: bool,
        cx: &mut RequestCtx,
    ) -> Result<(), GatewayError> {
        self.plugins.iter().rev().try_for_each(|p| p.on_response_chunk(body, eos, cx))
    }

    /// The model object as this caller sees it.
    pub fn model_object(&self, model: &ModelEntry, cx: &RequestCtx) -> Value {
        let mut object = match model.to_json() {
            Value::Object(o) => o,
            _ => Map::new(),
        };
        for p in &self.plugins {
            p.describe_model(model, &mut object, cx);
        }
        Value::Object(object)
    }

    /// Every plugin's log hook, in order. A panic in one is logged and the others still run:
    /// a later hook settles the request (billing), and that must not depend on an earlier one.
    pub async fn on_log(&self, cx: &mut RequestCtx) {
        for p in &self.plugins {
            let hook = async {
                crate::runtime::faults::panic_point_in("log", p.name());
                p.on_log(cx).await
            };
            if let Err(payload) = std::panic::AssertUnwindSafe(hook).catch_unwind().await {
                let what = crate::runtime::faults::panic_text(&*payload);
                log::error!("{}: panic in the {} plugin's log hook: {what}", cx.request_id, p.name());
            }
        }
    }
}
