//! The response normalisation of `response.rs` and `stream.rs`, done on raw JSON text
//! (`tollgate::json_raw`) instead of a `serde_json::Value`: same decisions, same members
//! changed, everything else copied as it arrived. A body or frame this path does not take
//! (not an object, a repeated key, an error frame, a stream's usage frame) returns `None`
//! before anything in `cx` changes, and the caller runs the `Value` path on it.

use std::sync::atomic::Ordering;

use bytes::{BufMut, BytesMut};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::response::{ChoiceOutput, output_status};
use tollgate::ctx::RequestCtx;
use tollgate::json_raw::{self, Members, ObjectWriter, Str};
use tollgate::usage;

/// One element of `choices`.
struct Choice<'a> {
    raw: &'a RawValue,
    /// `None`: not an object (copied as it is, not counted).
    members: Option<Members<'a>>,
    /// `message` or `delta`, when it is an object.
    part: Option<Members<'a>>,
    index: Option<u64>,
    finish_reason: Option<Str<'a>>,
    out: ChoiceOutput,
    /// The finish reason to explain in `service.output_status`.
    service: Option<Str<'a>>,
}

fn str_len(raw: Option<&RawValue>) -> usize {
    raw.and_then(json_raw::as_str).map_or(0, |s| s.0.len())
}

/// `normalize` of `response.rs`, read-only: what the part carries once rewritten.
fn part_output(part: &Members<'_>) -> ChoiceOutput {
    let rc = part.get("reasoning_content");
    let existing = part.get("reasoning");
    let reasoning = match rc {
        Some(rc) if existing.is_none_or(json_raw::is_null) => Some(rc),
        _ => existing,
    };
    let content = str_len(part.get("content"));
    let reasoning = str_len(reasoning);
    let tools = part.get("tool_calls").is_some_and(non_empty_array);
    let answer = content > 0 || tools;
    ChoiceOutput { changed: rc.is_some(), answer, output: answer || reasoning > 0, text_bytes: content + reasoning }
}

fn non_empty_array(raw: &RawValue) -> bool {
    let t = raw.get();
    t.starts_with('[') && t[1..].trim_start().as_bytes().first() != Some(&b']')
}

/// The elements of `choices` (an array), each split when it is an object.
fn choices<'a>(raw: &'a RawValue, part_key: &str) -> Option<Vec<Choice<'a>>> {
    let list: Vec<&'a RawValue> = serde_json::from_str(raw.get()).ok()?;
    let mut out = Vec::with_capacity(list.len());
    for raw in list {
        let mut c = Choice {
            raw,
            members: None,
            part: None,
            index: None,
            finish_reason: None,
            out: ChoiceOutput::default(),
            service: None,
        };
        if json_raw::is_object(raw) {
            let m = Members::of(raw)?;
            c.part = match m.get(part_key) {
                Some(p) if json_raw::is_object(p) => Some(Members::of(p)?),
                _ => None,
            };
            c.index = m.get("index").and_then(|r| serde_json::from_str::<u64>(r.get()).ok());
            c.finish_reason = m.get("finish_reason").and_then(json_raw::as_str);
            c.out = c.part.as_ref().map(part_output).unwrap_or_default();
            c.members = Some(m);
        }
        out.push(c);
    }
    Some(out)
}

/// The part with `reasoning_content` moved to `reasoning` (as `normalize` does).
fn write_part<B: BufMut>(out: &mut B, part: &Members<'_>) {
    let rc = part.get("reasoning_content");
    let existing = part.get("reasoning");
    let replace = rc.filter(|_| existing.is_none_or(json_raw::is_null));
    let mut w = ObjectWriter::new(out);
    for (k, v) in &part.0 {
        match (k.0.as_ref(), replace) {
            ("reasoning_content", _) => {}
            ("reasoning", Some(rc)) => w.raw("reasoning", rc.get()),
            (k, _) => w.raw(k, v.get()),
        }
    }
    if let (Some(rc), None) = (replace, existing) {
        w.raw("reasoning", rc.get());
    }
    w.finish();
}

fn write_choices<B: BufMut>(out: &mut B, list: &[Choice<'_>], part_key: &str) {
    out.put_u8(b'[');
    for (i, c) in list.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        let Some(m) = c.members.as_ref().filter(|_| c.out.changed || c.service.is_some()) else {
            out.put_slice(c.raw.get().as_bytes());
            continue;
        };
        let mut w = ObjectWriter::new(out);
        for (k, v) in &m.0 {
            let k = k.0.as_ref();
            if k == part_key && c.out.changed {
                if let Some(p) = &c.part {
                    w.with(k, |b| write_part(b, p));
                    continue;
                }
            }
            if k == "service" && c.service.is_some() {
                continue; // replaced below
            }
            w.raw(k, v.get());
        }
        if let Some(fr) = &c.service {
            w.with("service", |b| json_raw::write_json(b, &output_status(&fr.0)));
        }
        w.finish();
    }
    out.put_u8(b']');
}

/// The catalog id to put in `model`, when the replica's name is there (`rename_model`).
fn renamed_model<'c>(top: &Members<'_>, cx: &'c RequestCtx) -> Option<&'c str> {
    cx.pool.as_ref()?.from_upstream(&json_raw::as_str(top.get("model")?)?.0)
}

/// Write `top` with `model` renamed, `choices` rewritten where they changed, `usage`
/// dropped, then `usage_json` appended when given.
fn write_top<B: BufMut>(
    out: &mut B,
    top: &Members<'_>,
    model: Option<&str>,
    list: Option<&[Choice<'_>]>,
    part_key: &str,
    usage_json: Option<&str>,
) {
    let choices_changed = list.is_some_and(|l| l.iter().any(|c| c.out.changed || c.service.is_some()));
    let mut w = ObjectWriter::new(out);
    for (k, v) in &top.0 {
        match k.0.as_ref() {
            "usage" => {}
            "model" if model.is_some() => w.with("model", |b| json_raw::write_string(b, model.unwrap_or_default())),
            "choices" if choices_changed => {
                if let Some(l) = list {
                    w.with("choices", |b| write_choices(b, l, part_key));
                }
            }
            k => w.raw(k, v.get()),
        }
    }
    if let Some(u) = usage_json {
        w.raw("usage", u);
    }
    w.finish();
}

/// A whole non-streamed body (`response::on_chunk`): the new body, or `None` for the
/// `Value` path.
pub fn json_body(raw: &[u8], cx: &mut RequestCtx) -> Option<Vec<u8>> {
    let top = Members::parse(raw)?;
    // Anything but a completion with a list of choice objects is the `Value` path's to refuse.
    let mut list = match top.get("choices") {
        Some(c) if json_raw::is_array(c) => Some(choices(c, "message")?),
        _ => return None,
    };
    if list.iter().flatten().any(|c| c.members.is_none()) {
        return None;
    }
    let provider: Option<Value> = match top.get("usage") {
        Some(u) => Some(serde_json::from_str(u.get()).ok()?),
        None => None,
    };
    // Nothing can fail from here on.
    let mut choices_seen = 0;
    let mut answered_any = false;
    let mut text_bytes = 0;
    for c in list.iter_mut().flatten().filter(|c| c.members.is_some()) {
        choices_seen += 1;
        text_bytes += c.out.text_bytes;
        answered_any |= c.out.answer;
        if !c.out.answer {
            c.service = c.finish_reason.clone();
        }
    }
    let no_answer = choices_seen > 0 && !answered_any;
    let figures = match (provider.as_ref(), cx.model.as_ref()) {
        (Some(u), Some(m)) => usage::from_provider(u, m),
        _ => None,
    };
    cx.response.delivered_tokens = (text_bytes as u64).div_ceil(4);
    cx.response.delivered_text_bytes = text_bytes as u64;
    let usage_json = figures.map(|f| {
        cx.usage = Some(f);
        usage::render_chat_usage(&f, no_answer)
    });
    let mut out = Vec::with_capacity(raw.len() + usage_json.as_ref().map_or(0, String::len) + 64);
    write_top(&mut out, &top, renamed_model(&top, cx), list.as_deref(), "message", usage_json.as_deref());
    Some(out)
}

/// One stream frame's JSON payload (`stream::on_frame`): appends the frame to `out`
/// (`frame` itself when nothing changed), or `None` for the `Value` path (error frames and
/// the usage frame take it).
pub fn stream_frame(data: &[u8], frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) -> Option<()> {
    // A payload spread over several `data:` lines holds line breaks that copied text would
    // carry into one line: leave those to the `Value` path, which re-serializes everything.
    if memchr::memchr2(b'\n', b'\r', data).is_some() {
        return None;
    }
    if plain_frame(data, frame, cx, out) {
        return Some(());
    }
    let top = Members::parse(data)?;
    if top.get("error").is_some() && top.get("choices").is_none() {
        return None;
    }
    if top.get("usage").is_some_and(|u| !json_raw::is_null(u)) {
        return None;
    }
    let mut list = match top.get("choices") {
        Some(c) if json_raw::is_array(c) => Some(choices(c, "delta")?),
        _ => return None,
    };
    if list.iter().flatten().any(|c| c.members.is_none()) {
        return None;
    }
    // Nothing can fail from here on.
    let rename = renamed_model(&top, cx).is_some();
    let mut changed = rename;
    for (pos, c) in list.iter_mut().flatten().enumerate() {
        if c.members.is_none() {
            continue;
        }
        let idx = c.index.map_or(pos, |i| i as usize).min(64);
        if cx.response.answered.len() <= idx {
            cx.response.answered.resize(idx + 1, false);
        }
        if c.part.is_some() {
            changed |= c.out.changed;
            if c.out.output {
                cx.response.delivered_tokens += 1;
                cx.response.delivered_text_bytes += c.out.text_bytes as u64;
                cx.first_token_seen.store(true, Ordering::Release);
            }
            cx.response.answered[idx] |= c.out.answer;
        }
        if c.finish_reason.is_some() && !cx.response.answered[idx] {
            c.service = c.finish_reason.clone();
            changed = true;
        }
    }
    if !changed {
        out.extend_from_slice(frame);
        return Some(());
    }
    out.reserve(data.len() + 16);
    out.extend_from_slice(b"data: ");
    let model = if rename { renamed_model(&top, cx) } else { None };
    write_top(out, &top, model, list.as_deref(), "delta", None);
    out.extend_from_slice(b"\n\n");
    Some(())
}

/// The members of a frame this module reads, in one pass (everything else is skipped).
#[derive(Deserialize)]
struct FrameView<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    choices: Option<Vec<ChoiceView<'a>>>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(borrow)]
    index: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(borrow)]
    finish_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
}

/// The common frame, read in one pass: no error, no usage, no reasoning to move and no
/// choice ending without an answer. Its only possible change is the model name, spliced
/// into the text as it arrived. `false` (nothing in `cx` changed) for any other frame.
fn plain_frame(data: &[u8], frame: &[u8], cx: &mut RequestCtx, out: &mut BytesMut) -> bool {
    let Ok(view) = serde_json::from_slice::<FrameView<'_>>(data) else {
        return false;
    };
    if view.error.is_some() || view.usage.is_some() {
        return false;
    }
    // A frame without `choices` is not the common frame (the `Value` path judges it).
    let Some(choices) = view.choices else {
        return false;
    };
    // `index`, else the position (as `on_frame_value` reads it).
    let idxs: Vec<usize> = choices
        .iter()
        .enumerate()
        .map(|(pos, c)| {
            c.index.and_then(|r| serde_json::from_str::<u64>(r.get()).ok()).map_or(pos, |i| i as usize).min(64)
        })
        .collect();
    let mut outputs: Vec<Option<ChoiceOutput>> = Vec::with_capacity(choices.len());
    for (pos, c) in choices.iter().enumerate() {
        let idx = idxs[pos];
        let o = match &c.delta {
            Some(d) if d.reasoning_content.is_some() => return false,
            Some(d) => {
                let content = str_len(d.content);
                let reasoning = str_len(d.reasoning);
                let answer = content > 0 || d.tool_calls.is_some_and(non_empty_array);
                Some(ChoiceOutput {
                    changed: false,
                    answer,
                    output: answer || reasoning > 0,
                    text_bytes: content + reasoning,
                })
            }
            None => None,
        };
        if c.finish_reason.is_some_and(|f| f.get().starts_with('"')) {
            // Needs `service` unless this choice (here or in an earlier frame) answered.
            let answered = cx.response.answered.get(idx).copied().unwrap_or(false)
                || idxs[..=pos]
                    .iter()
                    .zip(outputs.iter().chain(std::iter::once(&o)))
                    .any(|(&i, o)| i == idx && o.is_some_and(|o| o.answer));
            if !answered {
                return false;
            }
        }
        outputs.push(o);
    }
    // Nothing can fail from here on.
    for (&idx, o) in idxs.iter().zip(&outputs) {
        if cx.response.answered.len() <= idx {
            cx.response.answered.resize(idx + 1, false);
        }
        if let Some(o) = o {
            if o.output {
                cx.response.delivered_tokens += 1;
                cx.response.delivered_text_bytes += o.text_bytes as u64;
                cx.first_token_seen.store(true, Ordering::Release);
            }
            cx.response.answered[idx] |= o.answer;
        }
    }
    let renamed = view.model.and_then(|m| Some((m, cx.pool.as_ref()?.from_upstream(&json_raw::as_str(m)?.0)?)));
    match renamed {
        None => out.extend_from_slice(frame),
        Some((m, id)) => {
            // `m` borrows from `data`: its offset there is where the name goes.
            let start = (m.get().as_ptr() as usize).saturating_sub(data.as_ptr() as usize);
            let end = start + m.get().len();
            out.reserve(data.len() + id.len() + 8);
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&data[..start]);
            json_raw::write_string(out, id);
            out.extend_from_slice(&data[end..]);
            out.extend_from_slice(b"\n\n");
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    //! Each case goes through this path and through the `Value` path: the output must be
    //! the same JSON and the context must end in the same state.
    use std::sync::Arc;

    use bytes::{Bytes, BytesMut};
    use serde_json::Value;

    use super::{json_body, stream_frame};
    use crate::chat::response::rewrite_value;
    use crate::chat::stream::on_frame_value;
    use tollgate::config::Config;
    use tollgate::ctx::RequestCtx;
    use tollgate::sse::data_payload;

    const UP: &str = "meta-llama/Llama-3.1-8B-Instruct";

    fn ctx() -> RequestCtx {
        static CONFIG: std::sync::OnceLock<Arc<Config>> = std::sync::OnceLock::new();
        let config = CONFIG
            .get_or_init(|| {
                // The bench's configuration: one model served under another name.
                let dir = std::env::temp_dir().join(format!("tollgate-raw-test-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(
                    dir.join("models.yaml"),
                    "models:\n  - id: llama-3.1-8b-instruct\n    display_name: L\n    created: 1721692800\n    \
                     supported_endpoints: [chat_completions]\n    max_output_tokens: 8192\n    \
                     context_window: 131072\n    pricing: { input: 0.10, output: 0.30 }\n",
                )
                .unwrap();
                std::fs::write(
                    dir.join("upstreams.yaml"),
                    format!(
                        "pools:\n  llama-3.1-8b-instruct:\n    upstream_model: {UP}\n    replicas:\n      \
                         - {{ address: \"127.0.0.1:9\", max_concurrency: 4 }}\n"
                    ),
                )
                .unwrap();
                std::fs::write(
                    dir.join("tollgate.yaml"),
                    "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\nmodels_file: models.yaml\n\
                     upstreams_file: upstreams.yaml\nplugins:\n  - name: chat_completions\n",
                )
                .unwrap();
                Arc::new(tollgate::config::load(&dir.join("tollgate.yaml")).unwrap())
            })
            .clone();
        let mut cx = RequestCtx::new(config.clone());
        cx.route = Some(tollgate::routes::Route::ChatCompletions);
        cx.model = config.catalog.get("llama-3.1-8b-instruct").cloned();
        cx.pool = config.pools.get("llama-3.1-8b-instruct").cloned();
        assert!(cx.model.is_some() && cx.pool.is_some());
        cx.logged = true;
        cx
    }

    fn state(cx: &RequestCtx) -> String {
        format!(
            "{:?} {:?} {} {} {} {} {:?}",
            cx.usage,
            cx.response.answered,
            cx.response.delivered_tokens,
            cx.response.delivered_text_bytes,
            cx.response.saw_done,
            cx.first_token_seen.load(std::sync::atomic::Ordering::Relaxed),
            cx.failure.as_ref().map(|f| f.kind),
        )
    }

    fn json(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
    }

    #[test]
    fn bodies_match_the_value_path() {
        let usage = r#""usage":{"prompt_tokens":3,"total_tokens":9,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":1}}"#;
        let cases = [
            format!(
                r#"{{"id":"c1","object":"chat.completion","created":17,"model":"{UP}","choices":[{{"index":0,"message":{{"role":"assistant","content":"tok0 tok1 ","reasoning_content":null}},"logprobs":null,"finish_reason":"stop"}}],{usage}}}"#
            ),
            format!(
                r#"{{"model":"{UP}","choices":[{{"message":{{"content":"","reasoning_content":"think"}},"finish_reason":"length"}}],{usage}}}"#
            ),
            format!(
                r#"{{"model":"{UP}","choices":[{{"message":{{"content":null,"reasoning":null,"reasoning_content":"t"}},"finish_reason":"stop","service":1}}]}}"#
            ),
            format!(
                r#"{{"model":"{UP}","choices":[{{"message":{{"reasoning":"keep","reasoning_content":"drop","tool_calls":[ ]}},"finish_reason":"stop"}}]}}"#
            ),
            format!(
                r#"{{"model":"{UP}","choices":[{{"message":{{"tool_calls":[{{"id":"x"}}]}},"finish_reason":"tool_calls"}},{{"message":"m","finish_reason":"stop"}}],{usage}}}"#
            ),
            format!(r#"{{"model":"{UP}", "choices": [], "usage": {{"total_tokens": 1}} }}"#),
        ];
        for body in &cases {
            let (mut a, mut b) = (ctx(), ctx());
            let fast = json_body(body.as_bytes(), &mut a).unwrap_or_else(|| panic!("not taken: {body}"));
            let slow = rewrite_value(body.as_bytes(), &mut b).unwrap();
            assert_eq!(json(&fast), json(&slow), "{body}");
            assert_eq!(state(&a), state(&b), "{body}");
        }
        // Left to the `Value` path.
        for body in
            ["[1]", "{\"a\":1,\"a\":2}", "not json", r#"{"choices":[{"message":{"content":"a","content":"b"}}]}"#]
        {
            assert!(json_body(body.as_bytes(), &mut ctx()).is_none(), "{body}");
        }
        // Not chat completions (decision 48): left to the `Value` path, which refuses them.
        for body in [
            format!(r#"{{"model":"{UP}","choices":[{{"message":{{"content":"a"}},"finish_reason":"stop"}},7]}}"#),
            r#"{"model":"other","choices":{},"usage":null,"x\"y":[1.50, 2e3]}"#.to_string(),
            "{}".to_string(),
        ] {
            assert!(json_body(body.as_bytes(), &mut ctx()).is_none(), "{body}");
            assert!(rewrite_value(body.as_bytes(), &mut ctx()).is_err(), "{body}");
        }
    }

    fn run(frames: &[String], fast: bool) -> (Vec<Value>, String) {
        let mut cx = ctx();
        cx.include_usage = true;
        let mut outs = Vec::new();
        for f in frames {
            let frame = Bytes::from(f.clone());
            let data = data_payload(&frame).unwrap().into_owned();
            let mut out = BytesMut::new();
            if !fast || stream_frame(&data, &frame, &mut cx, &mut out).is_none() {
                on_frame_value(&frame, &data, &mut cx, &mut out);
            }
            let text = out.strip_prefix(b"data: ").unwrap().strip_suffix(b"\n\n").unwrap();
            assert!(!text.contains(&b'\n'), "one data line: {}", String::from_utf8_lossy(&out));
            let mut v = json(text);
            if let Some(o) = v.as_object_mut() {
                o.remove("request_id"); // differs between the two contexts
            }
            outs.push(v);
        }
        (outs, state(&cx))
    }

    #[test]
    fn stream_frames_match_the_value_path() {
        let head = format!(r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"{UP}","#);
        let deltas = [
            r#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
            r#""choices":[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null}],"usage":null"#,
            r#""choices":[{"index":1,"delta":{"content":"tok0 "},"finish_reason":null},{"index":2,"delta":{"reasoning":null,"reasoning_content":"r"}}]"#,
            r#""choices":[{"index":0,"delta":{"content":"tok1 "},"logprobs":null,"finish_reason":null}]"#,
            r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":2,"delta":{},"finish_reason":"length"},{"index":1,"delta":{"tool_calls":[{"id":"t"}]},"finish_reason":"tool_calls"}]"#,
            r#""choices":[],"usage":{"prompt_tokens":4,"total_tokens":10,"completion_tokens":6}"#,
        ];
        let mut frames: Vec<String> = deltas.iter().map(|d| format!("data: {head}{d}}}\n\n")).collect();
        frames.push(format!("data: {head}\"choices\":[{{\"index\":3,\"delta\":{{\"content\":\"a\"}}}},{{\"index\":3,\"delta\":{{}},\"finish_reason\":\"stop\"}},{{\"delta\":{{\"content\":\"\"}},\"finish_reason\":\"stop\"}}]}}\n\n"));
        frames
            .push(format!("data: {head}\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n"));
        frames.push(format!("data: {head}\ndata: \"choices\":[{{\"index\":5,\"delta\":{{\"content\":\"b\"}}}}]}}\n\n"));
        frames.push("data: {\"model\":\"other\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n".into());
        frames.push("data: {\"error\":{\"message\":\"boom\"}}\n\n".into());
        assert_eq!(run(&frames, true), run(&frames, false));
        // The content frames take the one-pass path.
        let mut cx = ctx();
        let mut out = BytesMut::new();
        let f = frames[3].as_bytes();
        assert!(super::plain_frame(&f[6..f.len() - 2], f, &mut cx, &mut out));
        assert!(out.starts_with(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"llama-3.1-8b-instruct\",\"choices\""));
    }
}
