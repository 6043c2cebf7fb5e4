//! Several providers behind one [`Provider`]: a model is named `<provider>/<model>`, and each
//! request goes to its provider with the bare model id. The old single-endpoint configuration
//! is the provider `default`, whose models may be named without the prefix.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::pricing::{ModelPrice, Pricing};
use super::{ChatRequest, ChatResponse, Delta, LlmError, Provider, ProviderKind};

/// The name of the provider the single `[llm] base_url` form configures.
pub const DEFAULT_PROVIDER: &str = "default";

/// One configured provider.
pub struct ModelRoute {
    /// Its name, the prefix of its models' ids.
    pub name: String,
    /// The wire API it speaks.
    pub kind: ProviderKind,
    /// The adapter.
    pub provider: Arc<dyn Provider>,
    /// The models it offers by configuration (empty: any model id is passed through).
    pub models: Vec<String>,
    /// The catalog vendor whose API it reaches, whose models `model/list` offers for it.
    pub vendor: Option<&'static str>,
}

impl std::fmt::Debug for ModelRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRoute")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("models", &self.models)
            .field("vendor", &self.vendor)
            .finish_non_exhaustive()
    }
}

/// A model id no provider serves; the message names the choices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownModel(pub String);

/// What `model/list` says of one model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    /// The id to pass as `model`.
    pub id: String,
    /// Its provider's name.
    pub provider: String,
    /// Its provider's wire API.
    pub kind: ProviderKind,
    /// Tokens of prompt and completion together.
    pub context_window: u32,
    /// Whether it takes image input through agentd.
    pub images: bool,
    /// Whether its reasoning is streamed and carried across tool calls.
    pub reasoning: bool,
    /// USD per million tokens, when priced.
    pub prices: Option<ModelPrice>,
    /// Whether its calls are priced (unpriced calls count toward no budget).
    pub priced: bool,
}

/// The configured providers, routing each request by its model id.
#[derive(Debug)]
pub struct ModelRouter {
    routes: Vec<ModelRoute>,
    default_model: String,
}

impl ModelRouter {
    /// A router over `routes` whose default model is `default_model`.
    pub fn new(routes: Vec<ModelRoute>, default_model: String) -> Self {
        Self {
            routes,
            default_model,
        }
    }

    /// The model a session uses unless it names another.
    pub fn default_model(&self) -> &str {
        &self.default_model
    }

    /// The providers, in configuration order.
    pub fn routes(&self) -> &[ModelRoute] {
        &self.routes
    }

    /// The provider of `id` and the model's id at that provider; an empty id is the default.
    pub fn resolve<'a>(&'a self, id: &'a str) -> Result<(&'a ModelRoute, &'a str), UnknownModel> {
        let id = if id.is_empty() {
            self.default_model.as_str()
        } else {
            id
        };
        let found = id
            .split_once('/')
            .and_then(|(prefix, bare)| {
                self.routes
                    .iter()
                    .find(|r| r.name == prefix)
                    .map(|route| (route, bare))
            })
            .or_else(|| {
                self.routes
                    .iter()
                    .find(|r| r.name == DEFAULT_PROVIDER)
                    .map(|route| (route, id))
            });
        match found {
            Some((route, bare)) if !bare.is_empty() => {
                let offered = route.models.is_empty()
                    || route.models.iter().any(|m| m == bare)
                    || id == self.default_model;
                if offered {
                    return Ok((route, bare));
                }
                Err(UnknownModel(format!(
                    "unknown model {id:?}: provider {:?} offers {}",
                    route.name,
                    route
                        .models
                        .iter()
                        .map(|m| self.full_id(route, m))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            _ => Err(UnknownModel(format!(
                "unknown model {id:?}: name it \"<provider>/<model>\" with one of the providers {} \
                 (the default is {:?}; model/list shows the configured models)",
                self.routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.default_model
            ))),
        }
    }

    /// The id clients use for `model` at `route`.
    fn full_id(&self, route: &ModelRoute, model: &str) -> String {
        if route.name == DEFAULT_PROVIDER {
            model.to_string()
        } else {
            format!("{}/{model}", route.name)
        }
    }

    /// Every model worth offering, once each, the default first: each provider's listed
    /// models, the catalog's models of the vendor it reaches, and every model priced in
    /// `[llm.pricing]` that a provider serves. `context_limit` is `[llm] context_window`.
    pub fn models(&self, pricing: &Pricing, context_limit: u32) -> Vec<ModelInfo> {
        let mut ids: Vec<String> = vec![self.default_model.clone()];
        for route in &self.routes {
            ids.extend(route.models.iter().map(|m| self.full_id(route, m)));
            if let (Some(vendor), Some(catalog)) = (route.vendor, pricing.catalog()) {
                ids.extend(catalog.models_of(vendor).map(|m| self.full_id(route, m)));
            }
        }
        ids.extend(pricing.models().map(str::to_string));
        let mut seen = std::collections::BTreeSet::new();
        ids.into_iter()
            .filter(|id| seen.insert(id.clone()))
            .filter_map(|id| {
                let (route, _) = self.resolve(&id).ok()?;
                let card = pricing.card(&id);
                let prices = card.price();
                Some(ModelInfo {
                    provider: route.name.clone(),
                    kind: route.kind,
                    context_window: pricing.context_window(&id, context_limit),
                    images: card.images.unwrap_or(true),
                    reasoning: card.reasoning.unwrap_or(true),
                    priced: prices.is_some(),
                    prices,
                    id,
                })
            })
            .collect()
    }
}

#[async_trait]
impl Provider for ModelRouter {
    async fn stream_chat(
        &self,
        mut request: ChatRequest,
        deltas: mpsc::Sender<Delta>,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let asked = std::mem::take(&mut request.model);
        let (route, bare) = self
            .resolve(&asked)
            .map_err(|unknown| LlmError::BadResponse(unknown.0))?;
        request.model = bare.to_string();
        route.provider.stream_chat(request, deltas, cancel).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named;

    #[async_trait]
    impl Provider for Named {
        async fn stream_chat(
            &self,
            request: ChatRequest,
            _deltas: mpsc::Sender<Delta>,
            _cancel: CancellationToken,
        ) -> Result<ChatResponse, LlmError> {
            Ok(ChatResponse {
                text: request.model,
                ..ChatResponse::default()
            })
        }
    }

    fn route(name: &str, kind: ProviderKind, models: &[&str]) -> ModelRoute {
        ModelRoute {
            name: name.into(),
            kind,
            provider: Arc::new(Named),
            models: models.iter().map(|m| m.to_string()).collect(),
            vendor: None,
        }
    }

    fn router() -> ModelRouter {
        ModelRouter::new(
            vec![
                route("ds", ProviderKind::OpenAiChat, &[]),
                route("an", ProviderKind::Anthropic, &["claude-x", "claude-y"]),
            ],
            "ds/deepseek-v4-flash".into(),
        )
    }

    #[test]
    fn ids_resolve_to_their_provider_and_unknown_ones_name_the_choices() {
        let router = router();
        let (route, bare) = router.resolve("an/claude-y").unwrap();
        assert_eq!((route.name.as_str(), bare), ("an", "claude-y"));
        let (route, bare) = router.resolve("").unwrap();
        assert_eq!((route.name.as_str(), bare), ("ds", "deepseek-v4-flash"));
        // A provider with no list passes any model through; model ids may hold slashes.
        assert_eq!(router.resolve("ds/org/m").unwrap().1, "org/m");
        let err = router.resolve("an/claude-z").unwrap_err().0;
        assert!(err.contains("an/claude-x, an/claude-y"), "{err}");
        let err = router.resolve("gpt-5").unwrap_err().0;
        assert!(
            err.contains("ds, an") && err.contains("ds/deepseek-v4-flash"),
            "{err}"
        );
        assert!(router.resolve("ds/").is_err());
    }

    #[test]
    fn the_single_endpoint_form_is_the_default_provider_without_a_prefix() {
        let router = ModelRouter::new(
            vec![route(DEFAULT_PROVIDER, ProviderKind::OpenAiChat, &[])],
            "gpt-4o".into(),
        );
        assert_eq!(router.resolve("gpt-4o").unwrap().1, "gpt-4o");
        assert_eq!(router.resolve("default/o3").unwrap().1, "o3");
        let models = router.models(&Pricing::default(), 1000);
        assert_eq!(models.len(), 1);
        assert_eq!(models[0].id, "gpt-4o");
        assert!(!models[0].priced);
    }

    #[tokio::test]
    async fn requests_reach_their_provider_with_the_bare_id() {
        let (deltas, _) = mpsc::channel(1);
        let request = ChatRequest {
            model: "an/claude-x".into(),
            messages: Vec::new(),
            tools: Vec::new().into(),
            max_tokens: 1,
            reasoning_effort: None,
        };
        let answer = router()
            .stream_chat(request, deltas, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(answer.text, "claude-x");
    }

    #[test]
    fn the_list_has_the_default_first_then_listed_and_priced_models_once() {
        let mut prices = std::collections::BTreeMap::new();
        prices.insert("an/claude-x".to_string(), ModelPrice::new(3.0, 15.0));
        prices.insert(
            "ds/deepseek-v4-flash".to_string(),
            ModelPrice::new(0.1, 0.4),
        );
        prices.insert("nowhere/m".to_string(), ModelPrice::new(1.0, 1.0));
        let models = router().models(&Pricing::new(prices), 64_000);
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["ds/deepseek-v4-flash", "an/claude-x", "an/claude-y"]);
        assert!(models[0].priced && models[1].priced && !models[2].priced);
        assert_eq!(models[1].kind, ProviderKind::Anthropic);
        assert_eq!(models[1].prices.unwrap().output_per_mtok, 15.0);
    }
}
