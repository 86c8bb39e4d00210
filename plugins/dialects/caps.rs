//! What the translators need to know about a model, read once from its catalog entry.
//!
//! The translators work on this small value rather than on `ModelEntry` directly so they
//! can be tested without loading a catalog, and so the one place that knows where each
//! capability lives in the catalog is here.

pub use crate::shared::effort::Effort;
use tollgate::config::ModelEntry;

/// The effort to forward for a requested one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffortChoice {
    pub effort: Effort,
    /// The requested value was not supported and moved (warn `reasoning_effort_clamped`).
    pub clamped: bool,
}

/// Whether `thinking: disabled` can be honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningOff {
    /// `none` is a declared effort: forward `reasoning_effort: none`.
    Supported,
    /// Efforts are declared and `none` is not among them: the model cannot turn reasoning
    /// off, so the setting is ignored with a warning.
    Unsupported,
    /// No efforts are declared: the model exposes no reasoning control, nothing is sent
    /// and nothing is warned.
    Undeclared,
}

/// The capabilities of one model that change how a request is translated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelCaps {
    /// `input_modalities` includes `image`.
    pub image_input: bool,
    pub tool_calling: bool,
    /// A call cannot be forced among several tools (`forced_tool_calling: limited`).
    pub forced_tool_calling_limited: bool,
    pub json_mode: bool,
    /// Declared efforts, ascending and without repeats; empty when none are declared.
    pub reasoning_efforts: Vec<Effort>,
}

impl ModelCaps {
    pub fn of(model: &ModelEntry) -> ModelCaps {
        let efforts = model.reasoning_efforts.iter().filter_map(|e| Effort::parse(e)).collect();
        ModelCaps {
            image_input: model.input_modalities.iter().any(|m| m == "image"),
            tool_calling: model.tool_calling,
            forced_tool_calling_limited: model.chat.forced_tool_calling_limited,
            json_mode: model.json_mode,
            reasoning_efforts: efforts,
        }
        .normalized()
    }

    /// Sort and deduplicate the declared efforts (the catalog does not promise an order).
    pub fn normalized(mut self) -> ModelCaps {
        self.reasoning_efforts.sort_unstable();
        self.reasoning_efforts.dedup();
        self
    }

    pub fn reasoning_off(&self) -> ReasoningOff {
        if self.reasoning_efforts.is_empty() {
            ReasoningOff::Undeclared
        } else if self.reasoning_efforts.contains(&Effort::None) {
            ReasoningOff::Supported
        } else {
            ReasoningOff::Unsupported
        }
    }

    /// The effort to forward for `wanted`: kept when declared (or when nothing is declared,
    /// so the chat path's rules apply unchanged), otherwise the nearest declared one; on a
    /// tie the lower one, which spends less of the output budget (decisions.md 69).
    pub fn choose_effort(&self, wanted: Effort) -> EffortChoice {
        if self.reasoning_efforts.is_empty() || self.reasoning_efforts.contains(&wanted) {
            return EffortChoice { effort: wanted, clamped: false };
        }
        // Ascending order plus a strict `<` keeps the lower effort on a tie.
        let mut best = wanted;
        let mut best_distance = i32::MAX;
        for &e in &self.reasoning_efforts {
            let d = (e.rank() - wanted.rank()).abs();
            if d < best_distance {
                best = e;
                best_distance = d;
            }
        }
        EffortChoice { effort: best, clamped: true }
    }
}
