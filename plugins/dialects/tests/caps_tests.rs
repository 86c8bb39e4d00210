use super::support::*;
use crate::dialects::{Effort, EffortChoice, ModelCaps, ReasoningOff};

#[test]
fn efforts_parse_in_the_spec_order() {
    let names = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];
    let parsed: Vec<Effort> = names.iter().map(|n| Effort::parse(n).unwrap()).collect();
    assert!(parsed.windows(2).all(|w| w[0] < w[1]));
    for (e, n) in parsed.iter().zip(names) {
        assert_eq!(e.as_str(), n);
    }
    assert_eq!(Effort::parse("HIGH"), None);
    assert_eq!(Effort::parse("extreme"), None);
}

#[test]
fn declared_efforts_are_kept() {
    let c = caps(false, false, false, &["low", "medium", "high"]);
    assert_eq!(c.choose_effort(Effort::Medium), EffortChoice { effort: Effort::Medium, clamped: false });
}

#[test]
fn undeclared_efforts_pass_unchanged() {
    let c = caps(false, false, false, &[]);
    assert_eq!(c.choose_effort(Effort::Max), EffortChoice { effort: Effort::Max, clamped: false });
}

#[test]
fn unsupported_effort_moves_to_the_nearest_one() {
    let c = caps(false, false, false, &["low", "medium", "high"]);
    assert_eq!(c.choose_effort(Effort::Max), EffortChoice { effort: Effort::High, clamped: true });
    assert_eq!(c.choose_effort(Effort::Xhigh), EffortChoice { effort: Effort::High, clamped: true });
    assert_eq!(c.choose_effort(Effort::None), EffortChoice { effort: Effort::Low, clamped: true });
    assert_eq!(c.choose_effort(Effort::Minimal), EffortChoice { effort: Effort::Low, clamped: true });
}

#[test]
fn a_tie_moves_to_the_lower_effort() {
    let c = caps(false, false, false, &["high", "low"]);
    assert_eq!(c.choose_effort(Effort::Medium), EffortChoice { effort: Effort::Low, clamped: true });
    let c = caps(false, false, false, &["minimal", "max"]);
    // minimal is 3 below high, max is 2 above: nearest wins over lower.
    assert_eq!(c.choose_effort(Effort::High), EffortChoice { effort: Effort::Max, clamped: true });
}

#[test]
fn disabling_reasoning_depends_on_a_declared_none() {
    assert_eq!(caps(false, false, false, &["none", "low"]).reasoning_off(), ReasoningOff::Supported);
    assert_eq!(caps(false, false, false, &["low", "high"]).reasoning_off(), ReasoningOff::Unsupported);
    assert_eq!(caps(false, false, false, &[]).reasoning_off(), ReasoningOff::Undeclared);
}

#[test]
fn caps_are_read_from_a_real_catalog_entry() {
    let models = catalog_models(concat!(
        "models:\n",
        "- id: vision\n",
        "  supported_endpoints: [chat_completions, messages]\n",
        "  tool_calling: true\n",
        "  forced_tool_calling: limited\n",
        "  input_modalities: [text, image]\n",
        "  reasoning_efforts: [high, none, low]\n",
        "- id: plain\n",
        "  supported_endpoints: [messages]\n",
    ));
    assert_eq!(
        ModelCaps::of(&models[0]),
        ModelCaps {
            image_input: true,
            tool_calling: true,
            forced_tool_calling_limited: true,
            json_mode: false,
            reasoning_efforts: vec![Effort::None, Effort::Low, Effort::High],
        }
    );
    assert_eq!(ModelCaps::of(&models[1]), ModelCaps::default());
}
