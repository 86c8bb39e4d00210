//! Usage and cost: the hosted Usage object built from what the replica reported (or, for a
//! stream cut short, from what was delivered), priced in integer microcents.
//!
//! 1 USD = 100,000,000 microcents; prices are microcents per million tokens (see
//! `config::Pricing`). The dollar `cost` is rendered from microcents as a fixed eight-decimal
//! number, never computed in floating point.

use serde_json::Value;

use crate::config::{ModelEntry, Pricing};
use crate::money::Microcents;
use crate::runtime::clock::Millis;

/// Where the counts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBasis {
    /// The replica's usage report.
    ProviderReported,
    /// Counted from delivered frames because no usage report arrived (clarification 13).
    DeliveredFrames,
    /// A forwarded answer without a usage report: the request's input estimate (decision 153).
    RequestEstimate,
}

/// Who paid for a response when it was not credits (the usage's `service.paid_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaidFrom {
    Plan,
    Standby,
}

impl PaidFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            PaidFrom::Plan => "plan",
            PaidFrom::Standby => "standby",
        }
    }

    pub fn parse(s: &str) -> Option<PaidFrom> {
        match s {
            "plan" => Some(PaidFrom::Plan),
            "standby" => Some(PaidFrom::Standby),
            _ => None,
        }
    }
}

/// The billing figures of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageFigures {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Input tokens billed at the cached rate (0 when the model has no active cached tier).
    pub cached_tokens: u64,
    pub cost: Microcents,
    pub basis: UsageBasis,
    /// When a plan or Standby paid: who, and the usage value at per-token rates (`cost` is 0).
    pub paid: Option<(PaidFrom, Microcents)>,
}

impl UsageFigures {
    /// The figures as the client sees them when `from` paid: cost 0, the value kept apart.
    pub fn paid_by(mut self, from: Option<PaidFrom>) -> Self {
        if let Some(from) = from {
            self.paid = Some((from, self.cost));
            self.cost = Microcents::ZERO;
        }
        self
    }

    /// The usage value at per-token rates (the cost, or what a plan metered).
    pub fn value(&self) -> Microcents {
        self.paid.map_or(self.cost, |(_, v)| v)
    }
}

/// Cost in microcents, rounded half up to a whole microcent.
pub fn cost_microcents(pricing: Option<&Pricing>, prompt: u64, cached: u64, completion: u64) -> Microcents {
    let Some(p) = pricing else { return Microcents::ZERO };
    let cached = cached.min(prompt);
    let uncached = u128::from(prompt - cached);
    let cached_rate = u128::from(p.cached_input.unwrap_or(p.input));
    let scaled = uncached * u128::from(p.input)
        + u128::from(cached) * cached_rate
        + u128::from(completion) * u128::from(p.output);
    let micro = (scaled + 500_000) / 1_000_000;
    Microcents(u64::try_from(micro).unwrap_or(u64::MAX))
}

/// Figures from a replica's `usage` object, priced as at `priced_at` (the request's arrival);
/// `None` when it is not one.
pub fn from_provider(usage: &Value, model: &ModelEntry, priced_at: Millis) -> Option<UsageFigures> {
    let prompt = usage.get("prompt_tokens")?.as_u64()?;
    let completion = usage.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0);
    let total = usage.get("total_tokens").and_then(Value::as_u64).unwrap_or(prompt + completion);
    let reported_cached = usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
    Some(figures(model, priced_at, prompt, reported_cached, completion, total, UsageBasis::ProviderReported))
}

/// `from_provider` read straight from the report's text: the usual report (an object of
/// distinct members) without building a `Value`, anything else through `from_provider`, so
/// both read every report alike.
pub fn from_provider_text(
    usage: &str,
    model: &ModelEntry,
    priced_at: Millis,
    ceilings: Ceilings,
) -> Option<UsageFigures> {
    let reported = match reported_counts(usage) {
        Some(counts) => {
            let (prompt, cached, completion, total) = counts?;
            figures(model, priced_at, prompt, cached, completion, total, UsageBasis::ProviderReported)
        }
        None => from_provider(&serde_json::from_str(usage).ok()?, model, priced_at)?,
    };
    Some(ceilings.apply(reported, model, priced_at))
}

/// The most a usage report is believed for one request (`None`: no bound known).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ceilings {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
}

impl Ceilings {
    /// `f` with its counts held to the ceilings, priced again when one was above.
    pub fn apply(self, f: UsageFigures, model: &ModelEntry, priced_at: Millis) -> UsageFigures {
        let prompt = self.prompt.map_or(f.prompt_tokens, |c| f.prompt_tokens.min(c));
        let completion = self.completion.map_or(f.completion_tokens, |c| f.completion_tokens.min(c));
        if (prompt, completion) == (f.prompt_tokens, f.completion_tokens) {
            return f;
        }
        let total = prompt.saturating_add(completion);
        figures(model, priced_at, prompt, f.cached_tokens.min(prompt), completion, total, f.basis)
    }
}

/// (prompt, cached, completion, total) of a report, `Some(None)` when it names no prompt
/// count; `None` when it needs the general reading (not an object, a repeated member).
fn reported_counts(usage: &str) -> Option<Option<(u64, u64, u64, u64)>> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    struct Report<'a> {
        #[serde(borrow)]
        prompt_tokens: Option<&'a RawValue>,
        #[serde(borrow)]
        completion_tokens: Option<&'a RawValue>,
        #[serde(borrow)]
        total_tokens: Option<&'a RawValue>,
        #[serde(borrow)]
        prompt_tokens_details: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Details<'a> {
        #[serde(borrow)]
        cached_tokens: Option<&'a RawValue>,
    }
    // What `Value::as_u64` accepts: an integer's text; a fraction, an exponent, a string or
    // a sign (`-0` too) is not a count.
    let count = |raw: Option<&RawValue>| raw.and_then(|r| r.get().parse::<u64>().ok());
    // A derived struct also reads an array (fields by position), and borrowed raw members
    // skip `Value`'s nesting limit: such reports take the general reading.
    if !usage.trim_start().starts_with('{') || deeper_than(usage, 100) {
        return None;
    }
    let report: Report<'_> = serde_json::from_str(usage).ok()?;
    let cached = match report.prompt_tokens_details {
        Some(d) if d.get().starts_with('{') => count(serde_json::from_str::<Details<'_>>(d.get()).ok()?.cached_tokens),
        _ => None,
    };
    let Some(prompt) = count(report.prompt_tokens) else { return Some(None) };
    let completion = count(report.completion_tokens).unwrap_or(0);
    let total = count(report.total_tokens).unwrap_or(prompt + completion);
    Some(Some((prompt, cached.unwrap_or(0), completion, total)))
}

/// Whether JSON `text` nests arrays and objects deeper than `limit`.
fn deeper_than(text: &str, limit: usize) -> bool {
    // Each level opens with `{` or `[`, so text with no more of those than `limit` cannot go
    // deeper (ones inside strings only send it on to the scan). The count is one vectorized
    // pass over the usual short report; the scan is a branch per byte.
    let openers = text.bytes().filter(|b| matches!(b, b'{' | b'[')).count();
    openers > limit && nesting(text) > limit
}

/// The deepest nesting of arrays and objects in JSON `text` (strings skipped).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'{' | b'[') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b'}' | b']') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Price counts for `model` as at `priced_at`. Cached tokens count only where the model has an
/// active cached tier on an isolated cache; otherwise they are billed (and reported) as
/// uncached.
pub fn figures(
    model: &ModelEntry,
    priced_at: Millis,
    prompt: u64,
    reported_cached: u64,
    completion: u64,
    total: u64,
    basis: UsageBasis,
) -> UsageFigures {
    let pricing = model.pricing_at(priced_at);
    let cached_tier = pricing.as_ref().is_some_and(|p| p.cached_input.is_some());
    let cached = if cached_tier { reported_cached.min(prompt) } else { 0 };
    // Spec, Usage object rules: a response with no billable output settles at zero (its
    // prompt is not charged either).
    let cost =
        if completion == 0 { Microcents::ZERO } else { cost_microcents(pricing.as_ref(), prompt, cached, completion) };
    UsageFigures {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: total,
        cached_tokens: cached,
        cost,
        basis,
        paid: None,
    }
}

/// Figures of a forwarded answer (embeddings, rerank, audio, images; decision 153): its
/// `usage` read with the names replicas use (`prompt_tokens` or `input_tokens`,
/// `completion_tokens` or `output_tokens`, else `total_tokens` as input), or, without one,
/// `input_estimate` input tokens. The input is charged even without output tokens: for these
/// routes the answer is the output (the chat rule "no billable output settles at zero" is
/// about generated text).
pub fn from_forwarded(
    model: &ModelEntry,
    priced_at: Millis,
    usage: Option<&Value>,
    input_estimate: u64,
) -> UsageFigures {
    let count = |names: &[&str]| usage.and_then(|u| names.iter().find_map(|n| u.get(*n)?.as_u64()));
    let completion = count(&["completion_tokens", "output_tokens"]);
    let prompt = count(&["prompt_tokens", "input_tokens"])
        .or_else(|| count(&["total_tokens"]).map(|t| t.saturating_sub(completion.unwrap_or(0))));
    let (prompt, completion, basis) = match (prompt, completion) {
        (None, None) => (input_estimate, 0, UsageBasis::RequestEstimate),
        (p, c) => (p.unwrap_or(0), c.unwrap_or(0), UsageBasis::ProviderReported),
    };
    // A token is at least a byte of the request (the estimate is a quarter of its bytes): a
    // report of more input than that, plus a template's share, is not believed (decision 180).
    let prompt = prompt.min(input_estimate.saturating_mul(4).saturating_add(1024));
    let pricing = model.pricing_at(priced_at);
    UsageFigures {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt.saturating_add(completion),
        cached_tokens: 0,
        cost: cost_microcents(pricing.as_ref(), prompt, 0, completion),
        basis,
        paid: None,
    }
}

/// Usage of a response for which no usage report arrived but output was delivered (a stream
/// cut short, clarification 13): the prompt estimate and the delivered output. `None` when
/// nothing was delivered (nothing is billed).
pub fn from_delivered(
    model: &ModelEntry,
    priced_at: Millis,
    prompt_estimate: u64,
    delivered_tokens: u64,
) -> Option<UsageFigures> {
    (delivered_tokens > 0).then(|| {
        figures(
            model,
            priced_at,
            prompt_estimate,
            0,
            delivered_tokens,
            prompt_estimate + delivered_tokens,
            UsageBasis::DeliveredFrames,
        )
    })
}

/// `microcents` as dollars with exactly eight decimals, e.g. `0.00001234`.
pub fn dollars(microcents: u64) -> String {
    Microcents(microcents).dollars()
}

/// The chat-dialect Usage object as JSON text. `no_answer` adds
/// `service.output_token_accounting` (only when every choice lacks a final answer).
pub fn render_chat_usage(u: &UsageFigures, no_answer: bool) -> String {
    // Written piece by piece rather than through `format!`: this runs for every answer.
    let mut out = String::with_capacity(320);
    let mut n = itoa::Buffer::new();
    out.push_str("{\"prompt_tokens\":");
    out.push_str(n.format(u.prompt_tokens));
    out.push_str(",\"completion_tokens\":");
    out.push_str(n.format(u.completion_tokens));
    out.push_str(",\"total_tokens\":");
    out.push_str(n.format(u.total_tokens));
    out.push_str(",\"prompt_tokens_details\":{\"cached_tokens\":");
    out.push_str(n.format(u.cached_tokens));
    out.push_str("},\"cost\":");
    u.cost.write_dollars(&mut out);
    out.push_str(",\"service\":{\"cost_microcents\":");
    out.push_str(n.format(u.cost.0));
    out.push_str(",\"cached_input_tokens\":");
    out.push_str(n.format(u.cached_tokens));
    if let Some((from, value)) = u.paid {
        out.push_str(",\"plan_value_microcents\":");
        out.push_str(n.format(value.0));
        out.push_str(",\"paid_from\":\"");
        out.push_str(from.as_str());
        out.push('"');
    }
    if no_answer {
        out.push_str(",\"output_token_accounting\":{\"visible_answer_tokens\":0,\"non_answer_completion_tokens\":");
        out.push_str(n.format(u.completion_tokens));
        out.push_str(concat!(
            ",\"sources\":{\"visible_answer_tokens\":\"proxy_classified\",",
            "\"non_answer_completion_tokens\":\"provider_reported\"}}"
        ));
    }
    out.push_str("}}");
    out
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
