//! Retry timing of refusals and the momentary shed, `429 hosted_admission_congested` (no
//! `limit`, no scope header). The limits plugin sheds when admission checks pile up on its
//! store (decision 41), billing when the ledger's writes wait too long (decision 131).

use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::state::limits::ADMISSION_RETRY_CAP_MS;

/// `Retry-After` (whole seconds, rounded up, at least 1) and `Retry-After-Ms`.
pub fn with_retry(err: GatewayError, ms: u64) -> GatewayError {
    let ms = ms.max(1);
    err.with_retry_after(ms.div_ceil(1000)).with_header("retry-after-ms", ms.to_string())
}

/// An estimate capped at 8 seconds, spread by ±20% so refused clients do not return together
/// (spec "Retry rules": the value varies between refusals).
pub fn jittered(ms: u64) -> u64 {
    let r = u64::from(tollgate::http::error::rand_byte() % 41); // 0..=40
    let spread = ms.min(ADMISSION_RETRY_CAP_MS) * (80 + r) / 100;
    spread.clamp(1, ADMISSION_RETRY_CAP_MS)
}

/// Capacity shed on this instance, counted under `gate`, retried after `retry_ms`.
pub fn congested(gate: &str, retry_ms: u64) -> GatewayError {
    tollgate::observe::metrics::admission_refused(gate);
    with_retry(
        GatewayError::new(
            ErrorKind::HostedAdmissionCongested,
            "Capacity is being shed under momentary load; retry shortly. This is not a quota.",
        ),
        retry_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_estimates_are_capped_at_eight_seconds_and_vary() {
        let seen: std::collections::HashSet<u64> = (0..200).map(|_| jittered(60_000)).collect();
        assert!(seen.iter().all(|&ms| (6_400..=8_000).contains(&ms)), "{seen:?}");
        assert!(seen.len() > 5, "jitter varies: {seen:?}");
        assert!((1..=8_000).contains(&jittered(0)));
    }
}
