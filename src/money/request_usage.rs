//! The request's usage: one fact, read by settlement, the access line, metrics, traces and
//! idempotency receipts, with one owner.
//!
//! Whoever reads the replica's answer reports what it said ([`RequestUsage::report`]: the chat
//! pipeline for generation routes, billing for forwarded ones). The core completes it once,
//! after the response and before any log hook ([`RequestUsage::complete`]): a stream whose
//! client left is cut to what its connection took, and an answer that reported nothing is
//! counted from what was delivered (clarifications 13 and 19). Nothing else writes it.

use crate::config::ModelEntry;
use crate::money::usage::{PaidFrom, UsageBasis, UsageFigures, figures, from_delivered};
use crate::runtime::clock::Millis;

/// The usage of one request; see the module documentation.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestUsage {
    figures: Option<UsageFigures>,
}

/// What the core knows at the end of a response, to complete its usage.
pub struct Completion<'a> {
    pub model: &'a ModelEntry,
    /// When the request arrived: the instant its usage is priced at.
    pub priced_at: Millis,
    pub prompt_estimate: u64,
    /// Output tokens delivered to the client.
    pub delivered_tokens: u64,
    /// The stream was cut short (its client left or stopped reading) and its connection took
    /// fewer tokens than the gateway had passed on: `delivered_tokens` is what it took.
    pub cut_short: bool,
    pub paid_from: Option<PaidFrom>,
}

impl RequestUsage {
    /// The answer's usage report, priced (and marked as paid by a plan or Standby where one
    /// pays). A later report replaces an earlier one (a stream's usage frame comes last).
    pub fn report(&mut self, reported: UsageFigures) {
        self.figures = Some(reported);
    }

    /// The usage as reported so far, or as completed once the response ended.
    pub fn figures(&self) -> Option<UsageFigures> {
        self.figures
    }

    /// Completes the usage at the end of the response (the core, once, before the log hooks).
    pub fn complete(&mut self, c: &Completion) {
        match self.figures {
            // A report the client never got whole keeps its prompt and bills the completion
            // tokens its connection took.
            Some(reported) if c.cut_short => {
                let completion = c.delivered_tokens.min(reported.completion_tokens);
                let f = figures(
                    c.model,
                    c.priced_at,
                    reported.prompt_tokens,
                    reported.cached_tokens,
                    completion,
                    reported.prompt_tokens + completion,
                    UsageBasis::DeliveredFrames,
                );
                self.figures = Some(f.paid_by(c.paid_from));
            }
            Some(_) => {}
            None => {
                self.figures = from_delivered(c.model, c.priced_at, c.prompt_estimate, c.delivered_tokens)
                    .map(|f| f.paid_by(c.paid_from));
            }
        }
    }
}
