//! The one error catalogue of the gateway.
//!
//! Every refusal the spec names is a variant of [`ErrorKind`]; an exhaustive match gives
//! each its HTTP status, chat-dialect `type` and wire `code`, so a new variant does not
//! compile until it is classified. A [`GatewayError`] adds the message, `param`, the extra
//! fields that sit inside `error`, and the headers (Retry-After, Allow). Rendering into the
//! two envelopes lives in `envelope.rs`; nothing here has side effects.

use serde_json::{Map, Value};

/// Every catalogued failure. Codes that the spec uses with more than one status
/// (`upstream_error`, `upstream_http_error`, `auth_error`) have one variant per status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidJson,
    InvalidRequest,
    MissingRequiredField,
    GenerationCount,
    ContextLengthExceeded,
    UnsupportedModelOperation,
    HostedCapabilityNotSupported,
    HostedParameterNotSupported,
    /// 400 `upstream_error`: the replica refused the content.
    UpstreamRefused,
    InvalidIdempotencyKey,
    IdempotencyMismatch,
    InvalidTraceHeader,
    /// 400 `auth_error`: legacy deployment-scoped key on an inference route.
    LegacyKey,
    InvalidApiKey,
    InsufficientCredits,
    AccountFrozen,
    PlanLimitReached,
    SpendLimitReached,
    /// 403 `auth_error`: deactivated, terminal or internal key.
    KeyForbidden,
    CreditsScopeViolation,
    UsageScopeViolation,
    ModelNotFound,
    UnknownEndpoint,
    MethodNotAllowed,
    IdempotencyConflict,
    PayloadTooLarge,
    /// The request's header lines exceed `client.max_header_bytes` or `client.max_headers`.
    HeadersTooLarge,
    /// The request's head or body did not arrive within its deadline.
    RequestTimeout,
    IdempotencyReplayUnavailable,
    RateLimitExceeded,
    HostedPerKeyConcurrencyLimit,
    HostedWorkspaceConcurrencyLimit,
    HostedSharedModelConcurrencyLimit,
    HostedPlanConcurrencyLimit,
    HostedStandbyWorkspaceLimit,
    HostedStandbyAggregateLimit,
    HostedStandbyPressure,
    PlanWindowBusy,
    HostedWorkspaceTpmLimit,
    HostedAdmissionCongested,
    HostedSaturatedLargePrompt,
    HostedModelAtCapacity,
    InternalError,
    CreditReservationFailed,
    ResponseFormatError,
    /// 502 `upstream_error`: the replica was reached and then failed.
    UpstreamFailed,
    /// 502 `upstream_http_error`: the replica answered 5xx.
    UpstreamHttpError,
    ResponseTimeout,
    /// 200 `upstream_stream_error`: only ever rendered as an SSE error frame.
    UpstreamStreamError,
    HostedModelPaused,
    LimiterUnavailable,
    HostedAdmissionUnavailable,
    HostedEvidenceUnavailable,
    HostedInferenceUnavailable,
    DatastoreUnavailable,
    IdempotencyUnavailable,
    BillingSettlementError,
    PricingUnavailable,
    /// 503 `upstream_http_error`.
    UpstreamHttpUnavailable,
    /// 503 `upstream_error`: no replica could be connected.
    UpstreamUnreachable,
}

/// How a `Retry-After` value is chosen for a kind (spec: "503 codes", "Retry rules").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryRule {
    /// No `Retry-After` (4xx needing a changed request, 504, `hosted_inference_unavailable`).
    None,
    /// A fixed number of seconds.
    Fixed(u64),
    /// Randomized between 1 and 4 seconds (store outages).
    Randomized,
    /// Set by whoever raises the error (paused model, 429 estimates, forwarded upstream value).
    Caller,
}

impl ErrorKind {
    /// (HTTP status, chat-dialect `type`, wire `code`).
    pub fn spec(self) -> (u16, &'static str, &'static str) {
        use ErrorKind::*;
        const IRE: &str = "invalid_request_error";
        const AUTH: &str = "authentication_error";
        const PERM: &str = "permission_error";
        const RATE: &str = "rate_limit_error";
        const API: &str = "api_error";
        match self {
            InvalidJson => (400, IRE, "invalid_json"),
            InvalidRequest => (400, IRE, "invalid_request"),
            MissingRequiredField => (400, IRE, "missing_required_field"),
            GenerationCount => (400, IRE, "generation_count"),
            ContextLengthExceeded => (400, IRE, "context_length_exceeded"),
            UnsupportedModelOperation => (400, IRE, "unsupported_model_operation"),
            HostedCapabilityNotSupported => (400, IRE, "hosted_capability_not_supported"),
            HostedParameterNotSupported => (400, IRE, "hosted_parameter_not_supported"),
            UpstreamRefused => (400, IRE, "upstream_error"),
            InvalidIdempotencyKey => (400, IRE, "invalid_idempotency_key"),
            IdempotencyMismatch => (400, IRE, "idempotency_mismatch"),
            InvalidTraceHeader => (400, IRE, "invalid_trace_header"),
            LegacyKey => (400, AUTH, "auth_error"),
            InvalidApiKey => (401, AUTH, "invalid_api_key"),
            InsufficientCredits => (402, PERM, "insufficient_credits"),
            AccountFrozen => (402, PERM, "account_frozen"),
            PlanLimitReached => (402, PERM, "plan_limit_reached"),
            SpendLimitReached => (402, PERM, "spend_limit_reached"),
            KeyForbidden => (403, AUTH, "auth_error"),
            CreditsScopeViolation => (403, PERM, "credits_scope_violation"),
            UsageScopeViolation => (403, PERM, "usage_scope_violation"),
            ModelNotFound => (404, "not_found_error", "model_not_found"),
            UnknownEndpoint => (404, "not_found_error", "unknown_endpoint"),
            MethodNotAllowed => (405, IRE, "method_not_allowed"),
            IdempotencyConflict => (409, IRE, "idempotency_conflict"),
            PayloadTooLarge => (413, IRE, "payload_too_large"),
            HeadersTooLarge => (431, IRE, "request_header_fields_too_large"),
            RequestTimeout => (408, IRE, "request_timeout"),
            IdempotencyReplayUnavailable => (422, IRE, "idempotency_replay_unavailable"),
            RateLimitExceeded => (429, RATE, "rate_limit_exceeded"),
            HostedPerKeyConcurrencyLimit => (429, RATE, "hosted_per_key_concurrency_limit"),
            HostedWorkspaceConcurrencyLimit => (429, RATE, "hosted_workspace_concurrency_limit"),
            HostedSharedModelConcurrencyLimit => (429, RATE, "hosted_shared_model_concurrency_limit"),
            HostedPlanConcurrencyLimit => (429, RATE, "hosted_plan_concurrency_limit"),
            HostedStandbyWorkspaceLimit => (429, RATE, "hosted_standby_workspace_limit"),
            HostedStandbyAggregateLimit => (429, RATE, "hosted_standby_aggregate_limit"),
            HostedStandbyPressure => (429, RATE, "hosted_standby_pressure"),
            PlanWindowBusy => (429, RATE, "plan_window_busy"),
            HostedWorkspaceTpmLimit => (429, RATE, "hosted_workspace_tpm_limit"),
            HostedAdmissionCongested => (429, RATE, "hosted_admission_congested"),
            HostedSaturatedLargePrompt => (429, RATE, "hosted_saturated_large_prompt"),
            HostedModelAtCapacity => (429, RATE, "hosted_model_at_capacity"),
            InternalError => (500, API, "internal_error"),
            CreditReservationFailed => (500, API, "credit_reservation_failed"),
            ResponseFormatError => (502, API, "response_format_error"),
            UpstreamFailed => (502, API, "upstream_error"),
            UpstreamHttpError => (502, API, "upstream_http_error"),
            ResponseTimeout => (504, API, "hosted_inference_response_timeout"),
            UpstreamStreamError => (200, API, "upstream_stream_error"),
            HostedModelPaused => (503, API, "hosted_model_paused"),
            LimiterUnavailable => (503, API, "limiter_unavailable"),
            HostedAdmissionUnavailable => (503, API, "hosted_admission_unavailable"),
            HostedEvidenceUnavailable => (503, API, "hosted_evidence_unavailable"),
            HostedInferenceUnavailable => (503, API, "hosted_inference_unavailable"),
            DatastoreUnavailable => (503, API, "datastore_unavailable"),
            IdempotencyUnavailable => (503, API, "idempotency_unavailable"),
            BillingSettlementError => (503, API, "billing_settlement_error"),
            PricingUnavailable => (503, API, "pricing_unavailable"),
            UpstreamHttpUnavailable => (503, API, "upstream_http_error"),
            UpstreamUnreachable => (503, API, "upstream_error"),
        }
    }

    pub fn status(self) -> u16 {
        self.spec().0
    }

    pub fn code(self) -> &'static str {
        self.spec().2
    }

    /// Retry-After policy. 4xx that need a changed request carry none (spec "Retry
    /// guidance"); the 503 table says which 5xx carry one.
    pub fn retry_rule(self) -> RetryRule {
        use ErrorKind::*;
        match self {
            IdempotencyConflict => RetryRule::Fixed(1),
            InternalError | CreditReservationFailed => RetryRule::Fixed(1),
            LimiterUnavailable | HostedAdmissionUnavailable | HostedEvidenceUnavailable | DatastoreUnavailable => {
                RetryRule::Randomized
            }
            IdempotencyUnavailable | BillingSettlementError | PricingUnavailable => RetryRule::Fixed(2),
            UpstreamUnreachable => RetryRule::Fixed(2),
            HostedModelPaused | UpstreamHttpUnavailable | UpstreamHttpError => RetryRule::Caller,
            RateLimitExceeded
            | HostedPerKeyConcurrencyLimit
            | HostedWorkspaceConcurrencyLimit
            | HostedSharedModelConcurrencyLimit
            | HostedPlanConcurrencyLimit
            | HostedStandbyWorkspaceLimit
            | HostedStandbyAggregateLimit
            | HostedStandbyPressure
            | PlanWindowBusy
            | HostedWorkspaceTpmLimit
            | HostedAdmissionCongested
            | HostedSaturatedLargePrompt
            | HostedModelAtCapacity => RetryRule::Caller,
            _ => RetryRule::None,
        }
    }
}

/// One refusal or failure, ready to render in either envelope.
#[derive(Clone, Debug)]
pub struct GatewayError {
    pub kind: ErrorKind,
    pub message: String,
    pub param: Option<String>,
    /// Extra fields placed directly inside `error` (never under `details`).
    pub extra: Map<String, Value>,
    /// Extra response headers (lower-case names).
    pub headers: Vec<(&'static str, String)>,
    /// Seconds for `Retry-After` when the kind's rule is `Caller`.
    pub retry_after: Option<u64>,
}

impl GatewayError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        GatewayError {
            kind,
            message: message.into(),
            param: None,
            extra: Map::new(),
            headers: Vec::new(),
            retry_after: None,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_field(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(name.to_string(), value.into());
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The `Retry-After` seconds this error carries, if any.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        match self.kind.retry_rule() {
            RetryRule::None => None,
            RetryRule::Fixed(s) => Some(s),
            RetryRule::Randomized => Some(1 + u64::from(rand_byte() % 4)),
            RetryRule::Caller => self.retry_after,
        }
    }

    // Constructors for the common cases, so call sites read as the spec does.

    pub fn invalid_request(param: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message).with_param(param)
    }

    pub fn missing_field(param: &str) -> Self {
        Self::new(ErrorKind::MissingRequiredField, format!("Missing required field `{param}`.")).with_param(param)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InternalError, message)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.kind.code(), self.status(), self.message)
    }
}

impl std::error::Error for GatewayError {}

/// A byte of randomness for retry jitter. Not secret, so no system call per draw: std's
/// per-thread random hasher keys (seeded once, then stepped on every `RandomState::new`).
pub fn rand_byte() -> u8 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(0u8).to_le_bytes()[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_the_status_rule_of_the_envelope() {
        // Spec "Errors": type is tied to status classes.
        for kind in [
            ErrorKind::InvalidJson,
            ErrorKind::MethodNotAllowed,
            ErrorKind::IdempotencyConflict,
            ErrorKind::PayloadTooLarge,
            ErrorKind::IdempotencyReplayUnavailable,
        ] {
            assert_eq!(kind.spec().1, "invalid_request_error", "{kind:?}");
        }
        assert_eq!(ErrorKind::LegacyKey.spec(), (400, "authentication_error", "auth_error"));
        assert_eq!(ErrorKind::KeyForbidden.spec(), (403, "authentication_error", "auth_error"));
        assert_eq!(ErrorKind::UpstreamRefused.spec().2, "upstream_error");
        assert_eq!(ErrorKind::UpstreamUnreachable.spec(), (503, "api_error", "upstream_error"));
    }

    #[test]
    fn randomized_retry_after_stays_between_one_and_four() {
        for _ in 0..200 {
            let s = GatewayError::new(ErrorKind::DatastoreUnavailable, "x").retry_after_seconds().unwrap_or(0);
            assert!((1..=4).contains(&s), "{s}");
        }
    }

    #[test]
    fn client_errors_carry_no_retry_timing() {
        for kind in [
            ErrorKind::InvalidJson,
            ErrorKind::InvalidApiKey,
            ErrorKind::InsufficientCredits,
            ErrorKind::KeyForbidden,
            ErrorKind::ModelNotFound,
            ErrorKind::PayloadTooLarge,
            ErrorKind::ResponseTimeout,
            ErrorKind::HostedInferenceUnavailable,
        ] {
            assert_eq!(GatewayError::new(kind, "m").retry_after_seconds(), None, "{kind:?}");
        }
    }
}
