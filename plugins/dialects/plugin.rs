//! The messages dialect and the Responses adapter on the chat serving path: translate the
//! request into a chat body before the chat plugin rewrites it for the replica, and register
//! the translator the chat path feeds with the answer's typed pieces on the way back
//! (`RequestCtx::answer_translator`). `count_tokens` is answered here without a replica. The
//! translators themselves are in this folder.

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::{Value, json};

use super::{ChatTranslation, MessagesStream, Purpose, ResponsesStream, render_json, responses_to_chat, to_chat};
use crate::shared::answer::AnswerTranslator;
use crate::shared::prompt_tokens::count_prompt_tokens;
use tollgate::http::error::GatewayError;
use tollgate::http::routes::Route;
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};

/// Before the chat path (200) on requests; after it on responses.
pub const DIALECTS_PRIORITY: i16 = 300;

pub struct Dialects {
    /// Keys the opaque signature of thinking blocks.
    signing_key: Vec<u8>,
}

impl Dialects {
    pub fn new(signing_key: Vec<u8>) -> Self {
        Dialects { signing_key }
    }
}

impl Dialects {
    fn translate(&self, cx: &mut RequestCtx, t: ChatTranslation, translator: Box<dyn AnswerTranslator>) {
        if !t.warnings.is_empty() {
            cx.response_headers.push(("x-service-hint-warnings", t.warnings.join(", ")));
        }
        cx.body = Some(t.body);
        cx.answer_translator = Some(translator);
    }
}

#[async_trait]
impl Plugin for Dialects {
    fn name(&self) -> &'static str {
        "dialects"
    }

    fn priority(&self) -> i16 {
        DIALECTS_PRIORITY
    }

    async fn on_request(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        let (Some(route), Some(model)) = (cx.route, cx.model().cloned()) else { return Ok(Flow::Continue) };
        // Read in place: the chat route (most requests) passes through untouched.
        let null = Value::Null;
        let body = cx.body.as_ref().unwrap_or(&null);
        match route {
            Route::Messages => {
                let t = to_chat(body, &model, Purpose::Generate)?;
                let stream = MessagesStream::new(&model.id, &self.signing_key);
                if t.stream {
                    // Spec "Limits": a `ping` every 15 seconds while the replica is silent.
                    cx.heartbeat_payload = Some(super::ping());
                }
                self.translate(cx, t, Box::new(stream));
            }
            Route::CountTokens => {
                let t = to_chat(body, &model, Purpose::CountTokens)?;
                let tokens = count_prompt_tokens(&t.body, model.chat.tokenizer.as_deref());
                let answer = json!({ "input_tokens": tokens });
                tollgate::http::responder::json(s, cx, 200, Bytes::from(render_json(&answer)), &[])
                    .await
                    .map_err(|e| GatewayError::internal(format!("write failed: {e}")))?;
                return Ok(Flow::Handled);
            }
            Route::Responses => {
                let t = responses_to_chat(body, &model)?;
                self.translate(cx, t, Box::new(ResponsesStream::new(&model.id)));
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }

    fn on_response_header(&self, resp: &mut ResponseHeader, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        if cx.answer_translator.is_some() {
            resp.remove_header("content-length");
            let ct = if cx.response.streaming { "text/event-stream" } else { "application/json" };
            let _ = resp.insert_header("content-type", ct);
        }
        Ok(())
    }
}

/// The thinking-signature key: derived from the key pepper when identity is configured (so
/// every instance signs alike), else random for this process.
pub fn signing_key(pepper: Option<&[u8]>) -> Vec<u8> {
    use hmac::{Hmac, Mac};
    match pepper.and_then(|p| <Hmac<sha2::Sha256> as Mac>::new_from_slice(p).ok()) {
        Some(mut mac) => {
            mac.update(b"tollgate thinking signature v1");
            mac.finalize().into_bytes().to_vec()
        }
        None => {
            let mut k = vec![0u8; 32];
            if getrandom::fill(&mut k).is_err() {
                log::warn!("no randomness for the thinking-signature key");
            }
            k
        }
    }
}
