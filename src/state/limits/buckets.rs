//! One-second buckets over a sliding 60-second window, the in-process twin of what the Redis
//! script keeps in a hash (field = second, value = count). Bucket `s` covers
//! `[s * 1000, s * 1000 + 1000)` and is counted while `now_second <= s + 60`, so an entry
//! stays counted for more than 60 and at most 61 seconds.

use std::collections::VecDeque;

use super::WINDOW_MS;

/// Seconds a bucket stays counted after its own.
const SPAN_S: i64 = WINDOW_MS / 1000;

pub(crate) fn second_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(1000)
}

/// The instant bucket `sec` stops being counted.
pub(crate) fn leaves_at_ms(sec: i64) -> i64 {
    (sec + SPAN_S + 1) * 1000
}

#[derive(Debug, Default)]
pub(crate) struct SecondBuckets {
    /// (second, amount), ascending by second, amounts non-zero.
    buckets: VecDeque<(i64, u64)>,
    total: u64,
}

impl SecondBuckets {
    /// Drop the buckets no longer counted at `now_ms`; returns the counted total.
    pub(crate) fn trim(&mut self, now_ms: i64) -> u64 {
        let oldest = second_of(now_ms) - SPAN_S;
        while let Some(&(sec, n)) = self.buckets.front() {
            if sec >= oldest {
                break;
            }
            self.total -= n;
            self.buckets.pop_front();
        }
        self.total
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Record `amount` at `now_ms` (concurrent callers may arrive slightly out of order).
    pub(crate) fn add(&mut self, now_ms: i64, amount: u64) {
        if amount == 0 {
            return;
        }
        let sec = second_of(now_ms);
        self.total += amount;
        let pos = self.buckets.iter().rposition(|&(s, _)| s <= sec);
        match pos {
            Some(i) if self.buckets[i].0 == sec => self.buckets[i].1 += amount,
            Some(i) => self.buckets.insert(i + 1, (sec, amount)),
            None => self.buckets.push_front((sec, amount)),
        }
    }

    /// The oldest counted second (call after `trim`).
    pub(crate) fn oldest(&self) -> Option<i64> {
        self.buckets.front().map(|&(s, _)| s)
    }

    /// Milliseconds from `now_ms` until at least `need` counted units have left the window
    /// (call after `trim`). If fewer are counted, until everything counted has left.
    pub(crate) fn wait_for(&self, need: u64, now_ms: i64) -> u64 {
        let mut freed = 0;
        let mut last = second_of(now_ms);
        for &(sec, n) in &self.buckets {
            freed += n;
            last = sec;
            if freed >= need {
                break;
            }
        }
        u64::try_from(leaves_at_ms(last) - now_ms).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_counted_between_60_and_61_seconds() {
        let mut b = SecondBuckets::default();
        b.add(10_999, 1);
        assert_eq!(b.trim(70_999), 1);
        assert_eq!(b.wait_for(1, 70_999), 1);
        assert_eq!(b.trim(71_000), 0);
        assert!(b.is_empty());
    }

    #[test]
    fn out_of_order_adds_keep_order() {
        let mut b = SecondBuckets::default();
        b.add(5_000, 1);
        b.add(3_000, 2);
        b.add(4_500, 4);
        b.add(5_100, 8);
        assert_eq!(b.trim(5_000), 15);
        assert_eq!(b.oldest(), Some(3));
        // Freeing 3 units needs seconds 3 (2) and 4 (4).
        assert_eq!(b.wait_for(3, 5_000), leaves_at_ms(4) as u64 - 5_000);
    }
}
