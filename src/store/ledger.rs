//! The credits ledger contract. Balances in integer cents, costs in integer microcents
//! (1 cent = 1,000,000); no floating point. Every change writes an entry, so the stored
//! balance is always the sum of the workspace's entries (`derived_balance` proves it).

use async_trait::async_trait;

use super::StoreError;
use crate::identity::Millis;

pub const MICROCENTS_PER_CENT: i64 = 1_000_000;

/// A workspace's money, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    /// Holds already deducted; may be negative.
    pub balance_cents: i64,
    /// Reserved by in-flight requests (inside the balance).
    pub held_cents: i64,
    /// Fractional cent carried to the next settlement.
    pub carry_microcents: i64,
    pub lifetime_purchases_cents: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOutcome {
    Placed {
        balance_cents: i64,
    },
    /// The balance cannot cover the hold; nothing was written.
    Insufficient {
        balance_cents: i64,
    },
}

/// One request's settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub request_id: String,
    pub workspace_id: String,
    pub key_id: Option<String>,
    pub cost_microcents: i64,
    pub now: Millis,
    /// UTC month of the settlement, `YYYY-MM` (the key spending limit's period).
    pub month: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOutcome {
    Settled {
        debit_cents: i64,
        balance_cents: i64,
    },
    /// This request was settled before; nothing changed.
    AlreadySettled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub id: i64,
    pub kind: String,
    pub source: Option<String>,
    pub amount_cents: i64,
    pub request_id: Option<String>,
    pub cost_microcents: Option<i64>,
    pub expires_at: Option<Millis>,
    pub created_at: Millis,
}

#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Add credit (`purchase`, `promo` or `grant`); purchases count toward lifetime
    /// purchases. Returns (entry id, new balance).
    async fn top_up(
        &self,
        workspace_id: &str,
        amount_cents: i64,
        source: &str,
        expires_at: Option<Millis>,
        now: Millis,
    ) -> Result<(i64, i64), StoreError>;

    async fn balance(&self, workspace_id: &str) -> Result<Option<Balance>, StoreError>;

    /// Reserve `amount_cents` for `request_id` if the balance covers it, atomically (no
    /// read-then-write race between concurrent requests of one workspace).
    async fn place_hold(
        &self,
        request_id: &str,
        workspace_id: &str,
        key_id: Option<&str>,
        amount_cents: i64,
        expires_at: Millis,
        now: Millis,
    ) -> Result<HoldOutcome, StoreError>;

    /// Release the request's hold (if still open) and debit its cost in whole cents with the
    /// fractional remainder carried. Exactly once per request id.
    async fn settle(&self, s: &Settlement) -> Result<SettleOutcome, StoreError>;

    /// Release the request's hold without charge (refusal or failure before output).
    /// `false` when there was no open hold.
    async fn release_hold(&self, request_id: &str, now: Millis) -> Result<bool, StoreError>;

    /// Release holds still open past their expiry (their gateway died); returns the request
    /// ids released. Never charges.
    async fn sweep_expired_holds(&self, now: Millis) -> Result<Vec<String>, StoreError>;

    async fn entries(&self, workspace_id: &str, limit: i64) -> Result<Vec<LedgerEntry>, StoreError>;

    /// SUM of the workspace's entries: must equal the stored balance.
    async fn derived_balance(&self, workspace_id: &str) -> Result<i64, StoreError>;

    /// Settled debits (cents) since `since` (the billing period's spend).
    async fn spent_since(&self, workspace_id: &str, since: Millis) -> Result<i64, StoreError>;

    /// Settled cost (microcents) of a key in a UTC month `YYYY-MM`.
    async fn key_month_spend(&self, key_id: &str, month: &str) -> Result<i64, StoreError>;

    /// Freeze (`Some(reason)`) or unfreeze (`None`). `false` when there is no such workspace.
    async fn set_frozen(&self, workspace_id: &str, reason: Option<&str>) -> Result<bool, StoreError>;
}

/// Whole cents to debit for `cost` given the carried remainder: (debit, new carry).
pub fn debit_with_carry(carry_microcents: i64, cost_microcents: i64) -> (i64, i64) {
    let total = carry_microcents + cost_microcents.max(0);
    (total / MICROCENTS_PER_CENT, total % MICROCENTS_PER_CENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_cent_costs_carry_until_a_cent_is_due() {
        let mut carry = 0;
        let mut debited = 0;
        for _ in 0..10 {
            let (d, c) = debit_with_carry(carry, 250_000); // a quarter cent each
            debited += d;
            carry = c;
        }
        assert_eq!(debited, 2);
        assert_eq!(carry, 500_000);
        assert_eq!(debited * MICROCENTS_PER_CENT + carry, 10 * 250_000, "nothing lost, nothing invented");
    }
}
