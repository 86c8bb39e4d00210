//! Spans made from a finished request and handed to OpenTelemetry's batch processor, which
//! exports them over OTLP/HTTP (protobuf) on a thread of its own.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceFlags, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanEvents, SpanLinks, SpanProcessor,
};

use super::RequestTrace;
use crate::http::routes::Route;
use crate::proxy::ctx::RequestCtx;

/// Checked `tracing:` of `tollgate.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP traces URL (e.g. `http://127.0.0.1:4318/v1/traces`).
    pub otlp_endpoint: String,
    /// Share of requests without a sampled parent that are exported (0 to 1).
    pub sample_ratio: f64,
    pub service_name: String,
}

/// The exporter of one process.
pub struct Exporter {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    pub sample_ratio: f64,
}

/// Spans waiting for export at most; beyond it new ones are dropped (and counted by the SDK).
const QUEUE: usize = 8_192;

impl Exporter {
    pub fn new(settings: &TracingSettings) -> Result<Exporter, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(settings.otlp_endpoint.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("tracing.otlp_endpoint: {e}"))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE)
            .with_max_export_batch_size(512)
            .with_scheduled_delay(Duration::from_millis(500))
            .build();
        let mut processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
        processor.set_resource(&Resource::builder().with_service_name(settings.service_name.clone()).build());
        let scope = InstrumentationScope::builder("tollgate").with_version(env!("CARGO_PKG_VERSION")).build();
        Ok(Exporter { processor, scope, sample_ratio: settings.sample_ratio })
    }

    /// Export a finished request's spans (a sampled one's; others cost nothing here).
    pub fn finish(&self, cx: &RequestCtx, status: u16) {
        let Some(trace) = cx.trace.as_ref().filter(|t| t.sampled) else { return };
        let end = SystemTime::now();
        let replica = cx
            .placement
            .as_ref()
            .and_then(|p| p.ran_on.map(|i| (p.pool.replicas[i].addr.ip().to_string(), p.pool.replicas[i].addr.port())));
        let mut server = Vec::new();
        if let Some((host, port)) = &replica {
            server.push(KeyValue::new("server.address", host.clone()));
            server.push(KeyValue::new("server.port", i64::from(*port)));
        }

        let mut attrs = vec![KeyValue::new("tollgate.request_id", cx.request_id.clone())];
        let operation = cx.route.map(operation_name);
        if let Some(op) = operation {
            attrs.push(KeyValue::new("gen_ai.operation.name", op));
        }
        if let Some(model) = cx.model() {
            attrs.push(KeyValue::new("gen_ai.request.model", model.id.clone()));
        }
        if let Some(u) = cx.usage.figures() {
            attrs.push(KeyValue::new("gen_ai.usage.input_tokens", i64::try_from(u.prompt_tokens).unwrap_or(i64::MAX)));
            attrs.push(KeyValue::new(
                "gen_ai.usage.output_tokens",
                i64::try_from(u.completion_tokens).unwrap_or(i64::MAX),
            ));
        }
        if !trace.finish_reasons.is_empty() {
            let reasons = trace.finish_reasons.iter().map(|r| r.clone().into()).collect();
            attrs.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(opentelemetry::Array::String(reasons)),
            ));
        }
        attrs.push(KeyValue::new("http.response.status_code", i64::from(status)));
        if let Some(f) = &cx.failure {
            attrs.push(KeyValue::new("error.type", f.kind.code()));
        }
        attrs.extend(server.iter().cloned());
        let name = match (operation, cx.model()) {
            (Some(op), Some(m)) => Cow::Owned(format!("{op} {}", m.id)),
            (Some(op), None) => Cow::Borrowed(op),
            _ => Cow::Borrowed("tollgate request"),
        };
        // A server span is an error for a 5xx only (a 4xx is the client's).
        let status = if status >= 500 {
            Status::error(cx.failure.as_ref().map_or("server error", |f| f.kind.code()))
        } else {
            Status::Unset
        };
        let parent = (trace.parent.unwrap_or([0; 8]), trace.parent.is_some());
        self.emit(trace, trace.span_id, parent, SpanKind::Server, name, (trace.started, end), attrs, status);

        let under_request = (trace.span_id, false);
        for (phase, start, stop) in &trace.phases {
            let name = Cow::Borrowed(*phase);
            self.emit(
                trace,
                random_span(),
                under_request,
                SpanKind::Internal,
                name,
                (*start, *stop),
                Vec::new(),
                Status::Unset,
            );
        }
        if let (Some(start), Some(call)) = (trace.replica_started, &trace.replica_call) {
            let mut attrs = server;
            if let Some(s) = cx.response.upstream_status {
                attrs.push(KeyValue::new("http.response.status_code", i64::from(s)));
            }
            let name = Cow::Owned(call.clone());
            let (id, kind) = (trace.replica_span_id, SpanKind::Client);
            self.emit(trace, id, under_request, kind, name, (start, end), attrs, Status::Unset);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        trace: &RequestTrace,
        span_id: super::SpanId,
        (parent, parent_remote): (super::SpanId, bool),
        kind: SpanKind,
        name: Cow<'static, str>,
        (start_time, end_time): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        status: Status,
    ) {
        let state = trace.tracestate.as_deref().and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
        let span_context = SpanContext::new(
            opentelemetry::TraceId::from_bytes(trace.trace_id),
            opentelemetry::SpanId::from_bytes(span_id),
            TraceFlags::SAMPLED,
            false,
            state,
        );
        self.processor.on_end(SpanData {
            span_context,
            parent_span_id: opentelemetry::SpanId::from_bytes(parent),
            parent_span_is_remote: parent_remote,
            span_kind: kind,
            name,
            start_time,
            end_time: end_time.max(start_time),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        });
    }

    /// Send what is queued (a graceful stop).
    pub fn flush(&self) {
        if let Err(e) = self.processor.force_flush() {
            log::warn!("traces not all exported at stop: {e}");
        }
    }
}

/// `gen_ai.operation.name` of a route (the convention's values where one fits).
fn operation_name(route: Route) -> &'static str {
    match route {
        Route::ChatCompletions | Route::Responses | Route::Messages => "chat",
        Route::Embeddings => "embeddings",
        Route::CountTokens => "count_tokens",
        Route::Rerank => "rerank",
        Route::AudioSpeech => "speech",
        Route::AudioTranscriptions => "transcription",
        Route::ImageGenerations => "image_generation",
        Route::ListModels | Route::GetModel => "list_models",
        Route::Credits | Route::Usage => "account",
    }
}

fn random_span() -> super::SpanId {
    super::random()
}
