//! Per-model request rules of the chat serving path that `models.yaml` declares but
//! `GET /v1/models` never shows (the spec's Model object has no such fields): the system
//! message shape (rule 6), the JSON-format effort remedy (rule 9), refused efforts (rule 10),
//! the tokenizer used to count prompts (rule 11, `count_tokens`) and whether a call can be
//! forced among several tools (the messages request's `tool_choice`).

use std::path::Path;
use std::sync::Arc;

use super::Problems;
use super::tokenizer::PromptTokenizer;

/// Where a model accepts system messages (spec rule 6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SystemMessages {
    /// Anywhere, any number (the default).
    #[default]
    Any,
    /// One system message, as the first message: the chat path repairs the conversation.
    FirstOnly,
}

/// The checked rules of one model.
#[derive(Debug, Default)]
pub struct ChatRules {
    pub system_messages: SystemMessages,
    /// `forced_tool_calling: limited`: the model cannot be forced to call one of several
    /// tools (`tool_choice {type: any}` with two or more tools is refused).
    pub forced_tool_calling_limited: bool,
    /// Effort forwarded when a JSON format comes without `reasoning_effort` (rule 9);
    /// `None`: the model enforces JSON formats while reasoning, nothing is substituted.
    pub json_format_effort: Option<String>,
    /// Explicit efforts refused beside a JSON format (rule 9).
    pub json_format_refused_efforts: Vec<String>,
    /// Efforts the model refuses outright (rule 10).
    pub refused_efforts: Vec<String>,
    /// `None`: prompts are estimated by the documented bytes/4 rule.
    pub tokenizer: Option<Arc<PromptTokenizer>>,
}

/// The raw fields, as `models.yaml` spells them.
pub(super) struct RawChatRules<'a> {
    pub system_message: Option<&'a str>,
    pub forced_tool_calling: Option<&'a str>,
    pub json_format_effort: Option<&'a str>,
    pub json_format_refused_efforts: &'a [String],
    pub refused_efforts: &'a [String],
    pub tokenizer: Option<&'a str>,
    /// The published honored efforts, which a refused one may not be among.
    pub reasoning_efforts: &'a [String],
}

pub(super) fn check(
    p: &mut Problems,
    at: &dyn Fn(&str) -> String,
    raw: RawChatRules,
    models_dir: &Path,
    efforts: &[&str],
) -> ChatRules {
    let system_messages = match raw.system_message {
        None | Some("any") => SystemMessages::Any,
        Some("first_only") => SystemMessages::FirstOnly,
        Some(other) => {
            p.add(at("system_message"), format!("`{other}` is not one of any, first_only"));
            SystemMessages::Any
        }
    };
    let forced_tool_calling_limited = match raw.forced_tool_calling {
        None | Some("full") => false,
        Some("limited") => true,
        Some(other) => {
            p.add(at("forced_tool_calling"), format!("`{other}` is not one of full, limited"));
            false
        }
    };
    let mut effort_ok = |path: String, e: &str| {
        if !efforts.contains(&e) {
            p.add(path, format!("`{e}` is not one of {}", efforts.join(", ")));
        }
    };
    if let Some(e) = raw.json_format_effort {
        effort_ok(at("json_format_effort"), e);
    }
    for (j, e) in raw.json_format_refused_efforts.iter().enumerate() {
        effort_ok(at(&format!("json_format_refused_efforts[{j}]")), e);
    }
    for (j, e) in raw.refused_efforts.iter().enumerate() {
        effort_ok(at(&format!("refused_efforts[{j}]")), e);
    }
    for (j, e) in raw.refused_efforts.iter().enumerate() {
        if raw.reasoning_efforts.contains(e) {
            p.add(at(&format!("refused_efforts[{j}]")), format!("`{e}` is also listed in reasoning_efforts"));
        }
    }
    match raw.json_format_effort {
        // The refusal names the effort to use instead, so there must be one that works.
        None if !raw.json_format_refused_efforts.is_empty() => {
            p.add(at("json_format_effort"), "needed beside json_format_refused_efforts (the refusal names it)");
        }
        Some(e) if raw.json_format_refused_efforts.iter().any(|r| r == e) => {
            p.add(at("json_format_effort"), format!("`{e}` is also listed in json_format_refused_efforts"));
        }
        Some(e) if raw.refused_efforts.iter().any(|r| r == e) => {
            p.add(at("json_format_effort"), format!("`{e}` is also listed in refused_efforts"));
        }
        _ => {}
    }
    let tokenizer = raw.tokenizer.and_then(|t| match PromptTokenizer::load(&models_dir.join(t)) {
        Ok(tok) => Some(Arc::new(tok)),
        Err(e) => {
            p.add(at("tokenizer"), e);
            None
        }
    });
    ChatRules {
        system_messages,
        forced_tool_calling_limited,
        json_format_effort: raw.json_format_effort.map(str::to_string),
        json_format_refused_efforts: raw.json_format_refused_efforts.to_vec(),
        refused_efforts: raw.refused_efforts.to_vec(),
        tokenizer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Load a one-file catalog; the problems as text on failure.
    fn load(models: &str) -> Result<crate::config::Config, String> {
        let dir = std::env::temp_dir().join(format!("tollgate-chat-rules-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/tiny-bpe.json");
        std::fs::copy(fixture, dir.join("tok.json")).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("tollgate.yaml"), "threads: 1\n").map_err(|e| e.to_string())?;
        std::fs::write(dir.join("models.yaml"), models).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n").map_err(|e| e.to_string())?;
        let config = crate::config::load(&dir.join("tollgate.yaml")).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        config
    }

    const BASE: &str = "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n";

    #[test]
    fn rules_load_and_stay_out_of_the_model_object() {
        let yaml = format!(
            "{BASE}    system_message: first_only\n    forced_tool_calling: limited\n    json_format_effort: low\n    json_format_refused_efforts: [high]\n    refused_efforts: [none]\n    tokenizer: tok.json\n"
        );
        let config = load(&yaml).unwrap_or_else(|e| panic!("{e}"));
        let m = &config.catalog.models[0];
        assert_eq!(m.chat.system_messages, SystemMessages::FirstOnly);
        assert!(m.chat.forced_tool_calling_limited);
        assert_eq!(m.chat.json_format_effort.as_deref(), Some("low"));
        assert_eq!(m.chat.refused_efforts, ["none"]);
        assert!(m.chat.tokenizer.is_some(), "path relative to models.yaml");
        let published = m.to_json();
        for field in [
            "system_message",
            "forced_tool_calling",
            "json_format_effort",
            "json_format_refused_efforts",
            "refused_efforts",
            "tokenizer",
        ] {
            assert!(published.get(field).is_none(), "{field} is not part of the Model object");
        }
    }

    #[test]
    fn bad_rules_are_config_problems_naming_the_field() {
        for (extra, path) in [
            ("system_message: last\n", "models[0].system_message"),
            ("forced_tool_calling: partial\n", "models[0].forced_tool_calling"),
            ("refused_efforts: [extreme]\n", "models[0].refused_efforts[0]"),
            ("json_format_refused_efforts: [high]\n", "models[0].json_format_effort"),
            ("json_format_effort: high\n    json_format_refused_efforts: [high]\n", "models[0].json_format_effort"),
            ("tokenizer: missing.json\n", "models[0].tokenizer"),
            ("tokenizer: models.yaml\n", "models[0].tokenizer"),
            ("reasoning_efforts: [none, low]\n    refused_efforts: [none]\n", "models[0].refused_efforts[0]"),
        ] {
            let e = load(&format!("{BASE}    {extra}")).err().unwrap_or_default();
            assert!(e.contains("models.yaml") && e.contains(path), "{extra}: {e}");
        }
    }
}
