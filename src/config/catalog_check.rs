//! `models.yaml` as written (`Raw*`, unknown fields refused) and the checks that turn one
//! declared model into a `ModelEntry`, each problem named by its dotted field path.

use std::path::Path;
use std::sync::{Arc, RwLock};

use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Map, json};

use super::catalog::{Catalog, ModelEntry, Pricing};
use super::chat_rules::{self, RawChatRules};
use super::{ConfigProblem, GatewaySettings, Problems, parse_yaml};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCatalog {
    pub(super) models: Vec<RawModel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) id: String,
    /// Other accepted ids (e.g. the upstream repository id of a mapped model).
    #[serde(default)]
    pub(super) aliases: Vec<String>,
    display_name: Option<String>,
    created: Option<i64>,
    #[serde(default = "default_modality")]
    modality: String,
    supported_endpoints: Vec<String>,
    #[serde(default)]
    tool_calling: bool,
    #[serde(default)]
    json_mode: bool,
    #[serde(default = "default_input_modalities")]
    input_modalities: Vec<String>,
    #[serde(default)]
    reasoning_efforts: Vec<String>,
    default_reasoning_effort: Option<String>,
    max_output_tokens: Option<u64>,
    context_window: Option<u64>,
    pricing: Option<RawPricing>,
    /// USD per million cached input tokens; declaring it activates the cached tier.
    cached_input_price: Option<f64>,
    cache_isolation: Option<String>,
    cache_tiers: Option<Vec<String>>,
    cache_retention: Option<String>,
    #[serde(default = "default_availability")]
    availability: String,
    paused_until: Option<String>,
    max_concurrent_requests_per_api_key: Option<u64>,
    max_tokens_per_minute_per_workspace: Option<u64>,
    /// Shared-model concurrency across every gateway instance (default: the pool's capacity).
    max_concurrent_requests: Option<u64>,
    /// Standby across every workspace (default: a quarter of the pool's capacity; 0 closes
    /// Standby on the model). Never published.
    max_concurrent_standby_requests: Option<u64>,
    /// Promotional free window: requests inside it are priced at zero and carry no hold.
    free_window: Option<RawFreeWindow>,
    // Chat request rules and token counting (`chat_rules.rs`); never published.
    /// `any` (default) or `first_only` (spec rule 6).
    system_message: Option<String>,
    /// `full` (default) or `limited`: a messages `tool_choice {type: any}` beside several
    /// tools is refused (the messages request table).
    forced_tool_calling: Option<String>,
    /// Effort forwarded when a JSON format comes without `reasoning_effort` (rule 9).
    json_format_effort: Option<String>,
    #[serde(default)]
    json_format_refused_efforts: Vec<String>,
    /// Efforts refused outright (rule 10).
    #[serde(default)]
    refused_efforts: Vec<String>,
    /// A Hugging Face `tokenizer.json`, relative to `models.yaml`.
    tokenizer: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFreeWindow {
    starts_at: String,
    ends_at: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPricing {
    input: f64,
    output: f64,
}

fn default_modality() -> String {
    "llm".into()
}
fn default_input_modalities() -> Vec<String> {
    vec!["text".into()]
}
fn default_availability() -> String {
    "available".into()
}

const ENDPOINTS: &[&str] = &[
    "chat_completions",
    "responses",
    "messages",
    "embeddings",
    "rerank",
    "audio_speech",
    "audio_transcriptions",
    "image_generations",
];
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// USD per million tokens -> microcents per million tokens, refusing more precision than a
/// microcent per token can carry.
fn price(p: &mut Problems, path: &str, usd: f64) -> u64 {
    if !(usd.is_finite() && (0.0..=1_000_000.0).contains(&usd)) {
        p.add(path, format!("must be a price in USD per million tokens between 0 and 1000000, got {usd}"));
        return 0;
    }
    let scaled = usd * 100_000_000.0;
    let rounded = scaled.round();
    if (scaled - rounded).abs() > 1e-3 {
        p.add(path, format!("{usd} has more than 8 decimal places"));
    }
    rounded as u64
}

fn one_of(p: &mut Problems, path: &str, value: &str, allowed: &[&str]) {
    if !allowed.contains(&value) {
        p.add(path, format!("`{value}` is not one of {}", allowed.join(", ")));
    }
}

/// Read and check `models.yaml` (every problem is added to `out`).
pub(super) fn load(file: &Path, settings: &GatewaySettings, out: &mut Vec<ConfigProblem>) -> Option<Catalog> {
    let raw: RawCatalog = parse_yaml(file, out)?;
    let before = out.len();
    let mut p = Problems::new(file, out);
    let loaded_at = Timestamp::now().as_second();
    let models_dir = file.parent().unwrap_or(Path::new("."));
    let mut catalog = Catalog::default();
    for (i, m) in raw.models.into_iter().enumerate() {
        let names: Vec<(String, String)> = std::iter::once((format!("models[{i}].id"), m.id.clone()))
            .chain(m.aliases.iter().enumerate().map(|(j, a)| (format!("models[{i}].aliases[{j}]"), a.clone())))
            .collect();
        let entry = check_model(&mut p, i, m, settings, loaded_at, models_dir);
        let idx = catalog.models.len();
        for (path, name) in names {
            if catalog.by_name.insert(name.clone(), idx).is_some() {
                p.add(path, format!("`{name}` is already the id or alias of another model"));
            }
        }
        catalog.models.push(Arc::new(entry));
    }
    if catalog.models.is_empty() {
        p.add("models", "the catalog lists no model");
    }
    (out.len() == before).then_some(catalog)
}

pub(super) fn check_model(
    p: &mut Problems,
    i: usize,
    m: RawModel,
    settings: &GatewaySettings,
    loaded_at: i64,
    models_dir: &Path,
) -> ModelEntry {
    let at = |f: &str| format!("models[{i}].{f}");
    let chat = chat_rules::check(
        p,
        &at,
        RawChatRules {
            system_message: m.system_message.as_deref(),
            forced_tool_calling: m.forced_tool_calling.as_deref(),
            json_format_effort: m.json_format_effort.as_deref(),
            json_format_refused_efforts: &m.json_format_refused_efforts,
            refused_efforts: &m.refused_efforts,
            tokenizer: m.tokenizer.as_deref(),
            reasoning_efforts: &m.reasoning_efforts,
        },
        models_dir,
        EFFORTS,
    );
    if !super::valid_model_name(&m.id) {
        p.add(at("id"), "must be 1 to 256 characters without spaces or control characters");
    }
    if m.supported_endpoints.is_empty() {
        p.add(at("supported_endpoints"), "must list at least one endpoint");
    }
    for (j, e) in m.supported_endpoints.iter().enumerate() {
        one_of(p, &at(&format!("supported_endpoints[{j}]")), e, ENDPOINTS);
    }
    for (j, e) in m.input_modalities.iter().enumerate() {
        one_of(p, &at(&format!("input_modalities[{j}]")), e, &["text", "image"]);
    }
    for (j, e) in m.reasoning_efforts.iter().enumerate() {
        one_of(p, &at(&format!("reasoning_efforts[{j}]")), e, EFFORTS);
        if m.reasoning_efforts[..j].contains(e) {
            p.add(at(&format!("reasoning_efforts[{j}]")), format!("`{e}` is listed twice"));
        }
    }
    // The window holds the prompt and the output: an output ceiling above it cannot be met.
    if let (Some(out), Some(window)) = (m.max_output_tokens, m.context_window) {
        if out > window {
            p.add(at("max_output_tokens"), format!("{out} is above context_window ({window})"));
        }
    }
    if let Some(d) = &m.default_reasoning_effort {
        one_of(p, &at("default_reasoning_effort"), d, EFFORTS);
    }
    if let Some(c) = &m.cache_isolation {
        one_of(p, &at("cache_isolation"), c, &["isolated", "shared"]);
    }
    if let Some(c) = &m.cache_retention {
        one_of(p, &at("cache_retention"), c, &["best_effort", "tiered_host_memory"]);
    }
    one_of(p, &at("availability"), &m.availability, &["available", "paused"]);
    for (name, v) in [
        ("max_output_tokens", m.max_output_tokens),
        ("context_window", m.context_window),
        ("max_concurrent_requests_per_api_key", m.max_concurrent_requests_per_api_key),
        ("max_tokens_per_minute_per_workspace", m.max_tokens_per_minute_per_workspace),
        ("max_concurrent_requests", m.max_concurrent_requests),
    ] {
        if v == Some(0) {
            p.add(at(name), "must be at least 1 (leave it out when undeclared)");
        }
    }
    let paused_until = match (m.availability.as_str(), &m.paused_until) {
        ("paused", Some(t)) => match t.parse::<Timestamp>() {
            Ok(ts) => Some(ts),
            Err(e) => {
                p.add(at("paused_until"), format!("`{t}` is not an ISO 8601 time: {e}"));
                None
            }
        },
        ("paused", None) => {
            p.add(at("paused_until"), "a paused model needs the time of its next availability check");
            None
        }
        (_, Some(_)) => {
            p.add(at("paused_until"), "only allowed with availability: paused");
            None
        }
        _ => None,
    };
    let shared_cache = m.cache_isolation.as_deref() == Some("shared");
    let free_window = m.free_window.as_ref().and_then(|w| {
        let parse = |p: &mut Problems, field: &str, v: &str| match v.parse::<Timestamp>() {
            Ok(t) => Some(t.as_millisecond()),
            Err(e) => {
                p.add(at(&format!("free_window.{field}")), format!("`{v}` is not an ISO 8601 time: {e}"));
                None
            }
        };
        let (start, end) = (parse(p, "starts_at", &w.starts_at)?, parse(p, "ends_at", &w.ends_at)?);
        if end <= start {
            p.add(at("free_window.ends_at"), "must be after starts_at");
        }
        Some((start, end))
    });
    let pricing = m.pricing.as_ref().map(|pr| Pricing {
        input: price(p, &at("pricing.input"), pr.input),
        output: price(p, &at("pricing.output"), pr.output),
        cached_input: match m.cached_input_price {
            Some(c) if !shared_cache => Some(price(p, &at("cached_input_price"), c)),
            _ => None,
        },
    });
    if m.cached_input_price.is_some() && m.pricing.is_none() {
        p.add(at("cached_input_price"), "needs `pricing` beside it");
    }

    let mut o = Map::new();
    o.insert("object".into(), json!("model"));
    o.insert("id".into(), json!(m.id));
    o.insert("owned_by".into(), json!(settings.owned_by));
    o.insert("created".into(), json!(m.created.unwrap_or(loaded_at)));
    o.insert("display_name".into(), json!(m.display_name.clone().unwrap_or_else(|| m.id.clone())));
    o.insert("supported_endpoints".into(), json!(m.supported_endpoints));
    o.insert("modality".into(), json!(m.modality));
    o.insert("tool_calling".into(), json!(m.tool_calling));
    o.insert("json_mode".into(), json!(m.json_mode));
    o.insert("input_modalities".into(), json!(m.input_modalities));
    o.insert("reasoning_efforts".into(), json!(m.reasoning_efforts));
    o.insert("default_reasoning_effort".into(), json!(m.default_reasoning_effort));
    // Clarification 2: always present, null when no output limit is declared.
    o.insert("max_completion_tokens".into(), json!(m.max_output_tokens));
    // Clarification 3: gateway-wide values on every model.
    o.insert("max_request_bytes".into(), json!(settings.max_request_bytes));
    o.insert("response_time_ceiling_seconds".into(), json!(settings.budgets.response_ceiling_seconds));
    o.insert("session_affinity_idle_ttl_seconds".into(), json!(settings.budgets.session_affinity_idle_ttl_seconds));
    if let Some(w) = m.context_window {
        o.insert("context_window".into(), json!(w));
        o.insert("context_length".into(), json!(w));
    }
    if let Some(t) = m.max_output_tokens {
        o.insert("max_output_tokens".into(), json!(t));
    }
    if let Some(pr) = &m.pricing {
        o.insert("pricing".into(), json!({ "input": pr.input, "output": pr.output }));
    }
    if let (Some(c), false) = (m.cached_input_price, shared_cache) {
        o.insert("cached_input_price_usd_per_mtok".into(), json!(c));
        o.insert("cached_input_price".into(), json!(c));
    }
    if let Some(c) = &m.cache_isolation {
        o.insert("cache_isolation".into(), json!(c));
    }
    if let Some(c) = &m.cache_tiers {
        o.insert("cache_tiers".into(), json!(c));
    }
    if let Some(c) = &m.cache_retention {
        o.insert("cache_retention".into(), json!(c));
    }
    if let Some(v) = m.max_concurrent_requests_per_api_key {
        o.insert("max_concurrent_requests_per_api_key".into(), json!(v));
    }
    if let Some(v) = m.max_tokens_per_minute_per_workspace {
        o.insert("max_tokens_per_minute_per_workspace".into(), json!(v));
    }

    ModelEntry {
        id: m.id,
        supported_endpoints: m.supported_endpoints,
        tool_calling: m.tool_calling,
        json_mode: m.json_mode,
        input_modalities: m.input_modalities,
        max_output_tokens: m.max_output_tokens,
        context_window: m.context_window,
        pricing,
        shared_cache,
        free_window,
        max_concurrent_requests_per_api_key: m.max_concurrent_requests_per_api_key,
        max_tokens_per_minute_per_workspace: m.max_tokens_per_minute_per_workspace,
        max_concurrent_requests: m.max_concurrent_requests,
        max_concurrent_standby_requests: m.max_concurrent_standby_requests,
        chat,
        reasoning_efforts: m.reasoning_efforts,
        object: o,
        paused_until: RwLock::new(paused_until),
        set_by_operator: Default::default(),
    }
}
