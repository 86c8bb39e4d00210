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

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog model at $0.10 / $0.30 per million tokens, loaded as the gateway loads it.
    fn priced_model() -> std::sync::Arc<ModelEntry> {
        let dir = std::env::temp_dir().join(format!("tollgate-request-usage-{}", uuid::Uuid::new_v4().simple()));
        let _ = std::fs::create_dir_all(&dir);
        let models = "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    pricing: { input: 0.10, output: 0.30 }\n";
        let _ = std::fs::write(dir.join("tollgate.yaml"), "threads: 1\n");
        let _ = std::fs::write(dir.join("models.yaml"), models);
        let _ = std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n");
        let config = crate::config::load(&dir.join("tollgate.yaml"));
        let _ = std::fs::remove_dir_all(&dir);
        match config.map(|c| c.catalog.models.into_iter().next()) {
            Ok(Some(m)) => m,
            other => panic!("fixture catalog: {:?}", other.err()),
        }
    }

    fn completion(model: &ModelEntry, delivered_tokens: u64, cut_short: bool) -> Completion<'_> {
        Completion { model, priced_at: 0, prompt_estimate: 50, delivered_tokens, cut_short, paid_from: None }
    }

    fn reported(model: &ModelEntry) -> UsageFigures {
        figures(model, 0, 100, 0, 20, 120, UsageBasis::ProviderReported)
    }

    #[test]
    fn a_report_stands_when_the_client_took_the_whole_answer() {
        let model = priced_model();
        let mut u = RequestUsage::default();
        u.report(reported(&model));
        u.complete(&completion(&model, 20, false));
        assert_eq!(u.figures(), Some(reported(&model)));
    }

    #[test]
    fn a_stream_cut_short_keeps_its_prompt_and_bills_what_its_connection_took() {
        let model = priced_model();
        let mut u = RequestUsage::default();
        u.report(reported(&model));
        u.complete(&completion(&model, 7, true));
        let f = u.figures().expect("figures");
        assert_eq!((f.prompt_tokens, f.completion_tokens, f.basis), (100, 7, UsageBasis::DeliveredFrames));
        // 100 x 10 + 7 x 30 microcents (prices per million tokens, in microcents per token).
        assert_eq!(f.cost.0, 100 * 10 + 7 * 30);
    }

    #[test]
    fn an_answer_without_a_report_is_counted_from_what_was_delivered_and_nothing_from_nothing() {
        let model = priced_model();
        let mut u = RequestUsage::default();
        u.complete(&completion(&model, 12, false));
        let f = u.figures().expect("figures");
        assert_eq!((f.prompt_tokens, f.completion_tokens, f.basis), (50, 12, UsageBasis::DeliveredFrames));
        let mut none = RequestUsage::default();
        none.complete(&completion(&model, 0, true));
        assert_eq!(none.figures(), None, "no output delivered: no usage to bill");
    }
}
