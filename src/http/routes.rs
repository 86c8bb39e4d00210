//! The route table: every `/v1` path of the spec, its allowed method, the envelope its
//! errors use, and what the core does with it. A path that is not an endpoint (including a
//! base URL that already ends in an endpoint path, or a doubled `/v1`) is `UnknownEndpoint`.

use crate::http::envelope::Envelope;

/// A recognised endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    ChatCompletions,
    Responses,
    Messages,
    CountTokens,
    ListModels,
    /// `GET /v1/models/{model}`; the id is read from the path again where needed.
    GetModel,
    Credits,
    Usage,
    Embeddings,
    Rerank,
    AudioSpeech,
    AudioTranscriptions,
    ImageGenerations,
}

/// The outcome of matching a method and path.
#[derive(Debug, PartialEq, Eq)]
pub enum RouteMatch {
    Found(Route),
    /// Known path, wrong method: the `Allow` value.
    WrongMethod(Route, &'static str),
    Unknown,
}

const POST_PATHS: &[(&str, Route)] = &[
    ("/v1/chat/completions", Route::ChatCompletions),
    ("/v1/responses", Route::Responses),
    ("/v1/messages", Route::Messages),
    ("/v1/messages/count_tokens", Route::CountTokens),
    ("/v1/embeddings", Route::Embeddings),
    ("/v1/rerank", Route::Rerank),
    ("/v1/audio/speech", Route::AudioSpeech),
    ("/v1/audio/transcriptions", Route::AudioTranscriptions),
    ("/v1/images/generations", Route::ImageGenerations),
];

const GET_PATHS: &[(&str, Route)] =
    &[("/v1/models", Route::ListModels), ("/v1/credits", Route::Credits), ("/v1/usage", Route::Usage)];

impl Route {
    pub fn method(self) -> &'static str {
        match self {
            Route::ListModels | Route::GetModel | Route::Credits | Route::Usage => "GET",
            _ => "POST",
        }
    }

    pub fn envelope(self) -> Envelope {
        match self {
            Route::Messages | Route::CountTokens => Envelope::Messages,
            _ => Envelope::Chat,
        }
    }

    /// Routes whose JSON body names a model and goes to a replica.
    pub fn is_inference(self) -> bool {
        self.method() == "POST"
    }

    /// The name a model lists in `supported_endpoints` to accept this route.
    pub fn endpoint_name(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Responses => "responses",
            Route::Messages | Route::CountTokens => "messages",
            Route::Embeddings => "embeddings",
            Route::Rerank => "rerank",
            Route::AudioSpeech => "audio_speech",
            Route::AudioTranscriptions => "audio_transcriptions",
            Route::ImageGenerations => "image_generations",
            Route::ListModels | Route::GetModel | Route::Credits | Route::Usage => "",
        }
    }

    /// The path on the replica: the dialects are served by the chat serving path (spec "What
    /// the service does" 2); `None` keeps the client's path.
    pub fn upstream_path(self) -> Option<&'static str> {
        match self {
            Route::Messages | Route::Responses => Some("/v1/chat/completions"),
            _ => None,
        }
    }

    /// Routes whose bodies the gateway reads and rewrites (the rest are forwarded unchanged
    /// apart from the upstream model name).
    pub fn is_generation(self) -> bool {
        matches!(self, Route::ChatCompletions | Route::Responses | Route::Messages | Route::CountTokens)
    }

    /// Inference routes forwarded unchanged apart from the upstream model name (embeddings,
    /// rerank, audio, images): no dialect reads their bodies or answers.
    pub fn is_forwarded(self) -> bool {
        self.is_inference() && !self.is_generation()
    }
}

/// Match a request line. The query string is ignored.
pub fn classify(method: &str, path: &str) -> RouteMatch {
    let path = path.split('?').next().unwrap_or(path);
    let found = POST_PATHS
        .iter()
        .chain(GET_PATHS)
        .find(|(p, _)| *p == path)
        .map(|(_, r)| *r)
        .or_else(|| model_id_from_path(path).map(|_| Route::GetModel));
    match found {
        Some(route) if route.method() == method => RouteMatch::Found(route),
        // HEAD is not served; only the route's own method is allowed.
        Some(route) => RouteMatch::WrongMethod(route, route.method()),
        // Not an endpoint, so not a messages route either (a doubled `/v1/v1/messages`
        // included): the chat envelope, with `error.base_url` to show the base to use.
        None => RouteMatch::Unknown,
    }
}

/// The model id of `/v1/models/{model}`; ids may contain `/` (repository-style names).
pub fn model_id_from_path(path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or(path);
    path.strip_prefix("/v1/models/").filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_path_is_found_with_its_method() {
        for (p, r) in POST_PATHS.iter().chain(GET_PATHS) {
            assert_eq!(classify(r.method(), p), RouteMatch::Found(*r), "{p}");
        }
        assert_eq!(classify("GET", "/v1/models/org/model-7b"), RouteMatch::Found(Route::GetModel));
        assert_eq!(model_id_from_path("/v1/models/org/model-7b"), Some("org/model-7b"));
    }

    #[test]
    fn doubled_v1_and_endpoint_suffixed_base_urls_are_unknown() {
        for p in [
            "/v1/v1/chat/completions",
            "/v1/chat/completions/chat/completions",
            "/chat/completions",
            "/v1",
            "/",
            "/v1/models/",
            "/v1/completions",
        ] {
            assert_eq!(classify("POST", p), RouteMatch::Unknown, "{p}");
        }
        assert_eq!(classify("POST", "/v1/v1/messages"), RouteMatch::Unknown, "not a messages route");
    }

    #[test]
    fn wrong_method_names_the_allowed_one() {
        assert_eq!(classify("GET", "/v1/chat/completions"), RouteMatch::WrongMethod(Route::ChatCompletions, "POST"));
        assert_eq!(classify("POST", "/v1/credits"), RouteMatch::WrongMethod(Route::Credits, "GET"));
    }

    #[test]
    fn query_strings_do_not_change_the_route() {
        assert_eq!(classify("GET", "/v1/models?x=1"), RouteMatch::Found(Route::ListModels));
    }
}
