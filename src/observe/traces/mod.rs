//! Request traces (issue 52, decision 215): W3C `traceparent` accepted from the client and
//! continued at the replica, and, for sampled requests, a span per request with the GenAI
//! semantic convention attributes and child spans for the plugin phases that name one
//! (admission, the ledger hold) and the replica call, exported over OTLP. Off by default.
//!
//! A request keeps only ids and a few timestamps while it runs; its spans are made whole in
//! the logging phase from what the request recorded, so the hot path never touches the
//! exporter.

mod export;

use std::time::SystemTime;

pub use export::{Exporter, TracingSettings};

/// 16-byte trace id and 8-byte span ids, as W3C Trace Context writes them in hex.
pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

/// One request's trace: where it continues from, its own span ids, and what to export.
#[derive(Debug, Clone)]
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The client's span, when it sent a valid `traceparent`.
    pub parent: Option<SpanId>,
    /// This request's span.
    pub span_id: SpanId,
    /// The replica call's span: the parent the replica sees.
    pub replica_span_id: SpanId,
    /// Exported (and flagged sampled to the replica).
    pub sampled: bool,
    /// The client's `tracestate`, forwarded as is.
    pub tracestate: Option<String>,
    pub started: SystemTime,
    /// Phases a plugin named a span for: (name, start, end).
    pub phases: Vec<(&'static str, SystemTime, SystemTime)>,
    /// When the first replica call started.
    pub replica_started: Option<SystemTime>,
    /// The replica call's method and path (e.g. `POST /v1/chat/completions`).
    pub replica_call: Option<String>,
    /// The `finish_reason`s the replica gave (each once).
    pub finish_reasons: Vec<String>,
}

impl RequestTrace {
    /// Continue the client's trace, or start one. Sampling follows the client's decision
    /// when it sent one (parent-based, as every OpenTelemetry SDK does), else `ratio` of the
    /// trace ids, decided on the id so every hop decides alike.
    pub fn start(traceparent: Option<&str>, tracestate: Option<&str>, ratio: f64) -> RequestTrace {
        let parsed = traceparent.and_then(parse_traceparent);
        let (trace_id, parent, sampled) = match parsed {
            Some((trace, span, flags)) => (trace, Some(span), flags & 1 == 1),
            None => {
                let id: TraceId = random();
                (id, None, ratio_sampled(&id, ratio))
            }
        };
        RequestTrace {
            trace_id,
            parent,
            span_id: random(),
            replica_span_id: random(),
            sampled,
            tracestate: parsed.and(tracestate).filter(|s| s.len() <= 512).map(str::to_string),
            started: SystemTime::now(),
            phases: Vec::new(),
            replica_started: None,
            replica_call: None,
            finish_reasons: Vec::new(),
        }
    }

    /// A sampled request's trace, for phases that record what only its spans need.
    pub fn sampled(trace: &mut Option<RequestTrace>) -> Option<&mut RequestTrace> {
        trace.as_mut().filter(|t| t.sampled)
    }

    /// The `traceparent` the replica gets: this trace, the replica call as its parent.
    pub fn replica_traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.replica_span_id),
            u8::from(self.sampled)
        )
    }
}

/// `version-traceid-parentid-flags` (W3C Trace Context level 1): ids in lowercase hex, not
/// all zeros; version `ff` is invalid; a later version is read for its first four fields.
fn parse_traceparent(header: &str) -> Option<(TraceId, SpanId, u8)> {
    let header = header.trim();
    let mut parts = header.split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !lower_hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if !(lower_hex(trace, 32) && lower_hex(span, 16) && lower_hex(flags, 2)) {
        return None;
    }
    let trace: TraceId = hex::decode(trace).ok()?.try_into().ok()?;
    let span: SpanId = hex::decode(span).ok()?.try_into().ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    (trace != [0; 16] && span != [0; 8]).then_some((trace, span, flags))
}

/// The trace id's low 8 bytes against the ratio (OpenTelemetry's `TraceIdRatioBased` rule).
fn ratio_sampled(id: &TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let low = u64::from_be_bytes(id[8..].try_into().unwrap_or([0; 8])) >> 1;
    (low as f64) < ratio * (1u64 << 63) as f64
}

/// A non-zero random id from the thread's generator (what OpenTelemetry's SDKs use for ids;
/// a system call per id cost about 4 us of a 45 us request in the bench).
pub(crate) fn random<const N: usize>() -> [u8; N] {
    loop {
        let b: [u8; N] = rand::random();
        if b != [0u8; N] {
            return b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_continued_and_an_invalid_one_starts_a_trace() {
        let t = RequestTrace::start(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), Some("k=v"), 0.0);
        assert_eq!(hex::encode(t.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent.map(hex::encode).as_deref(), Some("00f067aa0ba902b7"));
        assert!(t.sampled, "the client's sampled flag wins over the ratio");
        assert_eq!(t.tracestate.as_deref(), Some("k=v"));
        let header = t.replica_traceparent();
        assert!(header.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && header.ends_with("-01"), "{header}");
        assert!(!header.contains("00f067aa0ba902b7"), "the replica's parent is the gateway's span");

        let unsampled = RequestTrace::start(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), None, 1.0);
        assert!(!unsampled.sampled);
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "garbage",
        ] {
            let t = RequestTrace::start(Some(bad), Some("k=v"), 1.0);
            assert!(t.parent.is_none() && t.tracestate.is_none(), "{bad} was accepted");
        }
        let later =
            RequestTrace::start(Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more"), None, 0.0);
        assert!(later.parent.is_some(), "a later version is read for its known fields");
    }

    #[test]
    fn the_ratio_samples_about_its_share_of_trace_ids() {
        let n = 20_000;
        let sampled = (0..n).filter(|_| ratio_sampled(&random(), 0.1)).count();
        assert!((1_600..=2_400).contains(&sampled), "{sampled} of {n} at 10%");
        assert!(ratio_sampled(&random(), 1.0));
        assert!(!ratio_sampled(&random(), 0.0));
    }
}
