//! Authentication (spec "Authentication"): reads the key from `Authorization: Bearer`
//! (and a non-blank `x-api-key` on the messages routes and the model reads, where it wins),
//! checks it against the identity service, applies the scope rules per route, and puts the
//! principal in the context for every later plugin.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::proxy::Session;

use tollgate::http::error::{ErrorKind, GatewayError};
use tollgate::http::routes::Route;
use tollgate::identity::KeyScope;
use tollgate::identity::service::{AuthFailure, Identity};
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};

/// Before every plugin that needs to know the caller.
pub const AUTH_PRIORITY: i16 = 500;

pub struct Auth {
    identity: Arc<Identity>,
}

impl Auth {
    pub fn new(identity: Arc<Identity>) -> Self {
        Auth { identity }
    }
}

/// Routes that also accept `x-api-key`.
fn accepts_x_api_key(route: Route) -> bool {
    matches!(route, Route::Messages | Route::CountTokens | Route::ListModels | Route::GetModel)
}

fn header(s: &Session, name: http::HeaderName) -> Option<&str> {
    s.req_header().headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// The presented key, if any.
pub fn presented_key(s: &Session, route: Route) -> Option<&str> {
    if accepts_x_api_key(route) {
        if let Some(k) = header(s, http::HeaderName::from_static("x-api-key")) {
            return Some(k);
        }
    }
    let auth = header(s, http::header::AUTHORIZATION)?;
    let (scheme, rest) = auth.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim()).filter(|k| !k.is_empty())
}

fn invalid(message: &str) -> GatewayError {
    GatewayError::new(ErrorKind::InvalidApiKey, message)
}

#[async_trait]
impl Plugin for Auth {
    fn name(&self) -> &'static str {
        "auth"
    }

    fn priority(&self) -> i16 {
        AUTH_PRIORITY
    }

    async fn on_request_headers(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        let Some(route) = cx.route else {
            return Ok(Flow::Continue);
        };
        let Some(key) = presented_key(s, route) else {
            return Err(invalid("Missing API key. Send `Authorization: Bearer <API_KEY>`."));
        };
        let (record, ws) = match self.identity.authenticate(key).await {
            Ok(found) => found,
            Err(AuthFailure::Invalid) => return Err(invalid("Invalid API key")),
            Err(AuthFailure::Expired) => return Err(invalid("API key has expired")),
            Err(AuthFailure::Deactivated) => {
                return Err(GatewayError::new(ErrorKind::KeyForbidden, "API key is deactivated"));
            }
            Err(AuthFailure::StoreUnavailable(e)) => {
                log::warn!("{}: key store unavailable: {e}", cx.request_id);
                return Err(GatewayError::new(
                    ErrorKind::DatastoreUnavailable,
                    "The key store cannot be read right now.",
                ));
            }
        };
        match (record.scope, route) {
            (KeyScope::Workspace, _) => {}
            (KeyScope::Deployment | KeyScope::Terminal, Route::Credits) => {
                return Err(GatewayError::new(
                    ErrorKind::CreditsScopeViolation,
                    "Reading credits needs a workspace key that can spend the balance.",
                ));
            }
            (KeyScope::Deployment | KeyScope::Terminal, Route::Usage) => {
                return Err(GatewayError::new(ErrorKind::UsageScopeViolation, "Reading usage needs a workspace key."));
            }
            (KeyScope::Terminal, r) if r.is_inference() => {
                return Err(GatewayError::new(
                    ErrorKind::KeyForbidden,
                    "This API key is internal (created by command-line sign-in) and cannot call inference.",
                ));
            }
            (KeyScope::Deployment, r) if r.is_inference() => {
                return Err(GatewayError::new(
                    ErrorKind::LegacyKey,
                    "This is a legacy deployment-scoped key; use a workspace key with the {base_url}/v1 base.",
                ));
            }
            _ => {}
        }
        cx.principal = Some(Identity::principal(&record, &ws));
        Ok(Flow::Continue)
    }
}
