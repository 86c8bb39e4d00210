//! How a limiter verdict reads on the wire: the `X-RateLimit-*` headers of the per-key
//! window, and each refusal's code, `error.limit`, `X-Hosted-Limit-*` and retry timing
//! (spec "Errors", "Retry rules", the Limits table).

use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::identity::RateTier;
use tollgate::state::limits::WindowState;

use crate::shared::shed::{jittered, with_retry};

/// Which admission gate refused; its wire code and `X-Hosted-Limit-Scope` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    PerKey,
    Workspace,
    LargePrompt,
    SharedModel,
    /// The shared-model gate of a model that declares no shared limit: its pool is full.
    Capacity,
    WorkspaceTpm,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::PerKey => "per_key_concurrency",
            Scope::Workspace => "workspace_concurrency",
            Scope::LargePrompt => "large_prompt",
            Scope::SharedModel => "shared_model_concurrency",
            Scope::Capacity => "model_capacity",
            Scope::WorkspaceTpm => "workspace_tpm",
        }
    }

    fn kind(self) -> ErrorKind {
        match self {
            Scope::PerKey => ErrorKind::HostedPerKeyConcurrencyLimit,
            Scope::Workspace => ErrorKind::HostedWorkspaceConcurrencyLimit,
            Scope::LargePrompt => ErrorKind::HostedSaturatedLargePrompt,
            Scope::SharedModel => ErrorKind::HostedSharedModelConcurrencyLimit,
            Scope::Capacity => ErrorKind::HostedModelAtCapacity,
            Scope::WorkspaceTpm => ErrorKind::HostedWorkspaceTpmLimit,
        }
    }

    fn message(self, limit: u64) -> String {
        match self {
            Scope::PerKey => format!(
                "This API key has {limit} requests in flight on a busy model; the limit clears when one finishes."
            ),
            Scope::Workspace => {
                format!("The workspace has {limit} hosted requests in flight; the limit clears when one finishes.")
            }
            Scope::LargePrompt => {
                "Very large prompts are deferred first while the model is near full concurrency; retry shortly. \
                 This is not a size limit."
                    .to_string()
            }
            Scope::SharedModel => format!("The model is saturated ({limit} requests in flight); retry shortly."),
            Scope::Capacity => "Every replica of the model is at its concurrency; retry shortly.".to_string(),
            Scope::WorkspaceTpm => format!("The workspace reached its {limit} tokens per minute on this model."),
        }
    }
}

/// The `X-RateLimit-*` headers of a per-key window.
pub fn window_headers(state: &WindowState, tier: RateTier) -> [(&'static str, String); 4] {
    [
        ("x-ratelimit-limit", state.limit.to_string()),
        ("x-ratelimit-remaining", state.remaining.to_string()),
        ("x-ratelimit-reset", (state.reset_at_ms.max(0) as u64).div_ceil(1000).to_string()),
        ("x-ratelimit-tier", tier.as_str().to_string()),
    ]
}

/// The per-key window (or the credits/usage read bucket) is full.
pub fn window_refused(state: &WindowState, tier: RateTier, retry_after_ms: u64, reads: bool) -> GatewayError {
    let what = if reads { "credits and usage reads" } else { "requests" };
    tollgate::observe::metrics::admission_refused(if reads { "read_window" } else { "key_window" });
    let mut err = GatewayError::new(
        ErrorKind::RateLimitExceeded,
        format!("Rate limit of {} {what} per minute reached for this API key.", state.limit),
    );
    err.headers.extend(window_headers(state, tier));
    // A request counts for at most 61 s (whole-second buckets), but a 60-second window never
    // asks for more than 60 s of patience (`Retry-After` in 1..=60, and `Retry-After-Ms` the
    // same wait: the spec has the one be the other rounded up; decision 53).
    with_retry(err, retry_after_ms.min(60_000))
}

/// The connection gate refused an unrecognized credential: no `X-RateLimit-*` headers.
pub fn gate_refused(retry_after_ms: u64) -> GatewayError {
    tollgate::observe::metrics::admission_refused("connection_gate");
    let err = GatewayError::new(
        ErrorKind::RateLimitExceeded,
        "Too many requests with unrecognized credentials; slow down and check the API key.",
    );
    with_retry(err, retry_after_ms)
}

/// An admission gate refused. `retry_after_ms: None` means waiting cannot help.
pub fn admission_refused(scope: Scope, limit: u64, retry_after_ms: Option<u64>) -> GatewayError {
    tollgate::observe::metrics::admission_refused(scope.name());
    let mut err = GatewayError::new(scope.kind(), scope.message(limit));
    if scope != Scope::Capacity {
        // A full pool is not a configured limit: no `limit` field, no scope header (spec,
        // `hosted_model_at_capacity`).
        err = err
            .with_field("limit", limit)
            .with_header("x-hosted-limit-scope", scope.name())
            .with_header("x-hosted-limit-value", limit.to_string());
    }
    match retry_after_ms {
        Some(ms) => with_retry(err, jittered(ms)),
        None => err,
    }
}

/// A single request above the tokens-per-minute limit: refused at once, no retry timing.
pub fn tpm_never(limit: u64, tokens: u64) -> GatewayError {
    let mut err = admission_refused(Scope::WorkspaceTpm, limit, None);
    err.message = format!(
        "This request alone needs about {tokens} tokens, above the workspace's {limit} tokens per minute on this \
         model; it cannot succeed by waiting. Shorten the prompt or lower `max_tokens`."
    );
    err
}

/// Momentary shed on this instance: no `limit`, no scope header.
pub fn congested() -> GatewayError {
    crate::shared::shed::congested("congested", jittered(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_retry_after_is_at_most_sixty_seconds() {
        let state = WindowState { limit: 5, remaining: 0, reset_at_ms: 61_000 };
        for ms in [1, 999, 59_001, 60_000, 60_001, 61_000] {
            let e = window_refused(&state, RateTier::Core, ms, false);
            let secs = e.retry_after_seconds().unwrap_or(0);
            assert!((1..=60).contains(&secs), "{ms} ms -> Retry-After {secs}");
        }
    }

    #[test]
    fn admission_refusals_name_their_gate() {
        let e = admission_refused(Scope::Workspace, 7, Some(1_500));
        assert_eq!(e.kind, ErrorKind::HostedWorkspaceConcurrencyLimit);
        assert_eq!(e.extra.get("limit").and_then(|v| v.as_u64()), Some(7));
        assert!(e.headers.contains(&("x-hosted-limit-scope", "workspace_concurrency".into())));
        assert!(e.headers.iter().any(|(k, _)| *k == "retry-after-ms"));
        assert!(e.retry_after_seconds().is_some_and(|s| (1..=2).contains(&s)));
        let c = congested();
        assert!(c.extra.get("limit").is_none() && !c.headers.iter().any(|(k, _)| k.starts_with("x-hosted")));
        let full = admission_refused(Scope::Capacity, 4, Some(1_000));
        assert_eq!(full.kind, ErrorKind::HostedModelAtCapacity);
        assert!(full.extra.get("limit").is_none() && !full.headers.iter().any(|(k, _)| k.starts_with("x-hosted")));
        assert!(full.retry_after_seconds().is_some());
        let never = tpm_never(100, 500);
        assert_eq!(never.retry_after_seconds(), None, "waiting cannot help");
    }
}
