//! The series a finished request moves, kept per thread by their labels. `prometheus` finds a
//! series by hashing its label values under a lock (about 450 instructions under callgrind) and
//! a request moves up to eight; a thread's requests mostly repeat a few label sets, which a
//! short scan of this thread's own list finds without a lock or a hash.

use std::cell::RefCell;

use prometheus::{Histogram, IntCounter};

/// Most label sets kept per metric and thread. Labels are bounded (metrics module comment);
/// this bounds the memory of an unusual mix: past it the list starts over.
const KEPT: usize = 64;

/// A metric's series by their `N` label values.
pub struct Series<M, const N: usize> {
    kept: Vec<([Box<str>; N], M)>,
}

impl<M, const N: usize> Default for Series<M, N> {
    fn default() -> Self {
        Series { kept: Vec::new() }
    }
}

impl<M, const N: usize> Series<M, N> {
    /// The series of `labels`, found by `lookup` the first time this thread sees them.
    pub fn get(&mut self, labels: [&str; N], lookup: impl FnOnce(&[&str; N]) -> M) -> &M {
        let found = self.kept.iter().position(|(kept, _)| kept.iter().zip(labels).all(|(k, l)| **k == *l));
        let at = match found {
            Some(at) => at,
            None => {
                if self.kept.len() >= KEPT {
                    self.kept.clear();
                }
                let series = lookup(&labels);
                self.kept.push((labels.map(Box::from), series));
                self.kept.len() - 1
            }
        };
        &self.kept[at].1
    }
}

/// This thread's series of the per-request metrics (`super::record`).
#[derive(Default)]
pub struct Local {
    pub requests: Series<IntCounter, 4>,
    pub duration: Series<Histogram, 2>,
    pub ttft: Series<Histogram, 1>,
    pub tpot: Series<Histogram, 1>,
    pub tokens: Series<IntCounter, 3>,
    pub cost: Series<IntCounter, 2>,
}

thread_local! {
    pub static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_set_is_looked_up_once_and_the_list_is_bounded() {
        let mut s: Series<usize, 2> = Series::default();
        let lookups = std::cell::Cell::new(0);
        let mut get = |a: &str, b: &str| {
            *s.get([a, b], |_| {
                lookups.set(lookups.get() + 1);
                lookups.get()
            })
        };
        assert_eq!(get("chat", "m1"), 1);
        assert_eq!(get("chat", "m2"), 2, "another label set is another series");
        assert_eq!(get("chat", "m1"), 1, "the first set is found again, not looked up");
        assert_eq!(get("cha", "tm1"), 3, "labels compare one by one, not joined");
        for i in 0..KEPT {
            get("fill", &i.to_string());
        }
        let before = lookups.get();
        assert_eq!(before, 3 + KEPT);
        assert_eq!(get("chat", "m1"), before + 1, "the list started over: looked up again");
        assert!(s.kept.len() <= KEPT, "{} kept", s.kept.len());
    }
}
