//! The OpenAPI document of every route tandem serves, generated from the handlers'
//! `#[utoipa::path]` attributes as the router registers them (`utoipa_axum::routes!`), so a
//! route cannot exist without its description. Served unauthenticated at `/openapi.json`; the
//! reliability suite's R8 runs schemathesis against it.

pub mod bodies;
pub mod tinker;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The document's fixed parts; paths are added by the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tandem",
        description = "Chat completions (OpenAI/vLLM-compatible) and RL fine-tuning (the W&B-Training-style /v1/preview area) from one server."
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "inference", description = "OpenAI/vLLM-compatible routes; errors are `{\"error\": {...}}`, validation a 400."),
        (name = "training", description = "The /v1/preview area ART's ServerlessBackend uses; errors are `{\"detail\": ...}`, validation a 422."),
        (name = "tinker", description = "The Tinker training API under /api/v1 (the `tinker` SDK's wire): training calls answer at once with a future that `retrieve_future` fetches; keys as `X-API-Key: tml-<key>`; errors are `{\"detail\": ...}`."),
        (name = "health", description = "Unauthenticated probes.")
    )
)]
pub struct ApiDoc;

/// Every route but the health probes and this document takes `Authorization: Bearer <key>`.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        // Anthropic's clients send the key as `x-api-key` (`/v1/messages` takes either).
        components.add_security_scheme(
            "x-api-key",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Header(
                utoipa::openapi::security::ApiKeyValue::new("x-api-key"),
            )),
        );
    }
}

/// The document as JSON, with what only the running server knows: the base model names a model
/// record may be created from.
pub fn render(document: &utoipa::openapi::OpenApi, served_models: &[String]) -> String {
    let mut doc = serde_json::to_value(document).unwrap_or_default();
    if let Some(base) = doc.pointer_mut("/components/schemas/CreateModelBody/properties/base_model") {
        base["enum"] = serde_json::json!(served_models);
    }
    doc.to_string()
}
