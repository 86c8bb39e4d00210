//! Money as the gateway keeps it: integer microcents for every price, cost and carried
//! remainder (1 cent = 1,000,000 microcents; 1 USD = 100,000,000), whole cents for balances,
//! holds and debits. Two types, so a cost cannot be debited as cents by mistake, and the
//! debit rule exists once.

pub mod plans;
pub mod request_usage;
pub mod usage;

/// Microcents in one cent.
pub const MICROCENTS_PER_CENT: i64 = 1_000_000;

/// A cost or a price in microcents (never negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Microcents(pub u64);

/// Whole cents: a balance (may be negative), a hold, a debit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Cents(pub i64);

impl Microcents {
    pub const ZERO: Microcents = Microcents(0);

    /// As the stores keep it (a signed column), saturating.
    pub fn as_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// From a stored value; a negative one (never written) counts as zero.
    pub fn from_stored(v: i64) -> Microcents {
        Microcents(u64::try_from(v).unwrap_or(0))
    }

    /// Whole cents, rounded up: what a hold must reserve to cover this cost.
    pub fn ceil_cents(self) -> Cents {
        let per = MICROCENTS_PER_CENT as u64;
        Cents(i64::try_from(self.0.div_ceil(per)).unwrap_or(i64::MAX))
    }

    /// US dollars with exactly eight decimals (`0.00001234`), never through floating point.
    pub fn dollars(self) -> String {
        let mut out = String::with_capacity(24);
        self.write_dollars(&mut out);
        out
    }

    /// `dollars`, appended to `out`.
    pub fn write_dollars(self, out: &mut String) {
        let mut n = itoa::Buffer::new();
        out.push_str(n.format(self.0 / 100_000_000));
        out.push('.');
        let fraction = n.format(self.0 % 100_000_000);
        out.extend(std::iter::repeat_n('0', 8 - fraction.len()));
        out.push_str(fraction);
    }
}

/// The debit rule (spec, Usage object rules): the balance is debited in whole cents and the
/// fractional remainder is carried to the next request, so one debit may differ from one
/// request's cost by less than a cent and nothing is lost or invented. Returns (debit, new
/// carry). The SQLite ledger calls this; the PostgreSQL ledger does the same integer
/// arithmetic inside its one settlement statement, and `tests/ledger_store.rs` checks both.
pub fn debit_with_carry(carry: Microcents, cost: Microcents) -> (Cents, Microcents) {
    let per = MICROCENTS_PER_CENT as u64;
    let total = carry.0.saturating_add(cost.0);
    (Cents(i64::try_from(total / per).unwrap_or(i64::MAX)), Microcents(total % per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_cent_costs_carry_until_a_cent_is_due() {
        let mut carry = Microcents::ZERO;
        let mut debited = 0;
        for _ in 0..10 {
            let (d, c) = debit_with_carry(carry, Microcents(250_000)); // a quarter cent each
            debited += d.0;
            carry = c;
        }
        assert_eq!(debited, 2);
        assert_eq!(carry, Microcents(500_000));
        assert_eq!(debited * MICROCENTS_PER_CENT + carry.as_i64(), 10 * 250_000, "nothing lost, nothing invented");
    }

    #[test]
    fn holds_round_up_and_dollars_have_eight_decimals() {
        assert_eq!(Microcents(1).ceil_cents(), Cents(1));
        assert_eq!(Microcents(1_000_000).ceil_cents(), Cents(1));
        assert_eq!(Microcents(1_000_001).ceil_cents(), Cents(2));
        assert_eq!(Microcents::ZERO.ceil_cents(), Cents(0));
        assert_eq!(Microcents(0).dollars(), "0.00000000");
        assert_eq!(Microcents(1_234).dollars(), "0.00001234");
        assert_eq!(Microcents(250_000_001).dollars(), "2.50000001");
        assert_eq!(Microcents::from_stored(-5), Microcents::ZERO);
    }
}
