//! Billing's refusals that depend on the ledger's state: the free-window field, the ledger
//! shedding load, a hold that could not be recorded, a ledger that cannot be read.

use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::runtime::clock::{iso, now_ms};
use tollgate::store::StoreError;

/// `free_window_ended_at` only when the called model's free window closed within the last
/// seven days; otherwise the field is absent (not null).
pub(super) fn with_free_window(err: GatewayError, cx: &RequestCtx) -> GatewayError {
    match cx.model().and_then(|m| m.free_window_recently_ended(now_ms())) {
        Some(end) => err.with_field("free_window_ended_at", iso(end)),
        None => err,
    }
}

/// The ledger sheds load (decision 131): the momentary capacity refusal, as the limits
/// plugin's, with an estimate that varies between refusals and stays under a second, so
/// `Retry-After` is 1.
pub(super) fn ledger_shed(request_id: &str, why: &dyn std::fmt::Display) -> GatewayError {
    log::debug!("{request_id}: hold shed: {why}");
    // `jittered` spreads 800..=1,200 ms; capped at a second so `Retry-After` stays 1.
    crate::shared::shed::congested("ledger", crate::shared::shed::jittered(1_000).min(1_000))
}

/// The hold could not be placed: shed, or a failed reservation.
pub(super) fn hold_failed(request_id: &str, e: StoreError) -> GatewayError {
    if let StoreError::Busy(why) = &e {
        return ledger_shed(request_id, why);
    }
    log::warn!("{request_id}: hold not recorded: {e}");
    GatewayError::new(ErrorKind::CreditReservationFailed, "The credit reservation could not be recorded; retry.")
}

pub(super) fn store_down(e: impl std::fmt::Display) -> GatewayError {
    log::warn!("ledger unavailable: {e}");
    GatewayError::new(ErrorKind::DatastoreUnavailable, "The credits ledger cannot be read right now.")
}
