//! The last step of a billed request, settle or release, and its retry while the store is
//! down (both are idempotent per request id, so a retry never charges twice).

use tollgate::runtime::clock::now_ms;
use tollgate::store::ledger::{LedgerStore, Settlement};

/// The last step of a billed request.
pub(super) enum Finish {
    Settle(Settlement),
    Release(String),
}

impl Finish {
    async fn run(&self, ledger: &dyn LedgerStore) -> Result<(), tollgate::store::StoreError> {
        self.outcome(ledger.submit(self.op()).await)
    }

    /// The ledger op of one attempt.
    pub(super) fn op(&self) -> tollgate::store::ledger::ops::LedgerOp {
        use tollgate::store::ledger::ops::LedgerOp;
        match self {
            Finish::Settle(s) => LedgerOp::Settle(s.clone()),
            Finish::Release(rid) => LedgerOp::Release { request_id: rid.clone(), now: now_ms() },
        }
    }

    /// Whether the op's outcome recorded it.
    pub(super) fn outcome(&self, r: tollgate::store::ledger::ops::OpResult) -> Result<(), tollgate::store::StoreError> {
        match self {
            Finish::Settle(_) => tollgate::store::ledger::settle_outcome(r).map(|_| ()),
            Finish::Release(_) => tollgate::store::ledger::release_outcome(r).map(|_| ()),
        }
    }

    /// Retry with backoff (1 s doubling to 60 s) for about an hour; whether it was recorded.
    pub(super) async fn retry(self, ledger: &dyn LedgerStore) -> bool {
        let mut wait = std::time::Duration::from_secs(1);
        for _ in 0..70 {
            tokio::time::sleep(wait).await;
            tollgate::observe::metrics::settlement_retried();
            match self.run(ledger).await {
                Ok(()) => {
                    log::info!("settlement recorded after a retry");
                    return true;
                }
                Err(e) => log::warn!("settlement retry failed: {e}"),
            }
            wait = (wait * 2).min(std::time::Duration::from_secs(60));
        }
        log::error!("settlement abandoned after an hour of retries; the hold expires and is released");
        false
    }
}

impl super::Billing {
    /// A hold whose answer did not come back may still have been recorded (a commit whose
    /// reply was lost): the request is refused, so the hold is released now rather than
    /// after its expiry (decision 173). Queued behind the hold's own op, and a no-op when no
    /// hold was recorded; a hold that was never queued (shed as `Busy`, or `NotQueued` by a
    /// full queue) needs none, and would only take a slot settlements need then.
    pub(super) fn release_unanswered_hold(&self, request_id: &str, e: &tollgate::store::StoreError) {
        use tollgate::store::StoreError;
        if matches!(e, StoreError::Busy(_) | StoreError::NotQueued(_)) {
            return;
        }
        let (ledger, request_id) = (self.ledger.clone(), request_id.to_string());
        let pending = tollgate::runtime::drain::left_behind();
        tokio::spawn(async move {
            match Finish::Release(request_id.clone()).run(&*ledger).await {
                Ok(()) => log::info!("{request_id}: unanswered hold released (if it was recorded)"),
                Err(e) => log::warn!("{request_id}: unanswered hold not released ({e}); the sweeper frees it"),
            }
            drop(pending);
        });
    }
}
