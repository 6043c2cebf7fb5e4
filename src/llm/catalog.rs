//! The model price and limits catalog embedded at build time, and the card of one model.
//!
//! `catalog.json` is a snapshot of the catalog LiteLLM maintains
//! (`model_prices_and_context_window.json`), cut down by `scripts/update-catalog` to the chat
//! models of the vendors a provider reaches directly. It was chosen over a crate because it is
//! the most widely kept price list (its prices carry cached-read and cache-write rates, context
//! windows and vision and reasoning flags) and a pinned snapshot changes only when someone
//! regenerates it on purpose. `[llm.pricing."MODEL"]` overrides it field by field.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use super::pricing::ModelPrice;

/// What is known of one model: its prices and limits, each field unknown when unset.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// The vendor whose own API serves it under this id (`openai`, `anthropic`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// USD per million prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_per_mtok: Option<f64>,
    /// USD per million completion tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_per_mtok: Option<f64>,
    /// USD per million prompt tokens read from the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<f64>,
    /// USD per million prompt tokens written to the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<f64>,
    /// Prompt tokens it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// Completion tokens it may answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Whether it takes image input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<bool>,
    /// Whether it reasons before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<bool>,
}

impl ModelCard {
    /// Its price, when both the input and the output price are known.
    pub fn price(&self) -> Option<ModelPrice> {
        Some(ModelPrice {
            input_per_mtok: self.input_per_mtok?,
            output_per_mtok: self.output_per_mtok?,
            cached_input_per_mtok: self.cached_input_per_mtok,
            cache_write_per_mtok: self.cache_write_per_mtok,
        })
    }

    /// This card where it says something, `under` where it does not.
    pub fn over(&self, under: &ModelCard) -> ModelCard {
        ModelCard {
            vendor: self.vendor.clone().or_else(|| under.vendor.clone()),
            input_per_mtok: self.input_per_mtok.or(under.input_per_mtok),
            output_per_mtok: self.output_per_mtok.or(under.output_per_mtok),
            cached_input_per_mtok: self.cached_input_per_mtok.or(under.cached_input_per_mtok),
            cache_write_per_mtok: self.cache_write_per_mtok.or(under.cache_write_per_mtok),
            context_window: self.context_window.or(under.context_window),
            max_output_tokens: self.max_output_tokens.or(under.max_output_tokens),
            images: self.images.or(under.images),
            reasoning: self.reasoning.or(under.reasoning),
        }
    }

    /// A card holding only `price`.
    pub fn priced(price: ModelPrice) -> Self {
        Self {
            input_per_mtok: Some(price.input_per_mtok),
            output_per_mtok: Some(price.output_per_mtok),
            cached_input_per_mtok: price.cached_input_per_mtok,
            cache_write_per_mtok: price.cache_write_per_mtok,
            ..Self::default()
        }
    }

    /// Why a configured card is unusable, if it is.
    pub fn invalid(&self) -> Option<&'static str> {
        let prices = [
            self.input_per_mtok,
            self.output_per_mtok,
            self.cached_input_per_mtok,
            self.cache_write_per_mtok,
        ];
        if prices.iter().flatten().any(|p| !p.is_finite() || *p < 0.0) {
            return Some("prices must be non-negative numbers");
        }
        if self.context_window == Some(0) || self.max_output_tokens == Some(0) {
            return Some("context_window and max_output_tokens must be above 0");
        }
        None
    }
}

/// The embedded catalog: model id at its vendor → card.
#[derive(Debug, PartialEq, Deserialize)]
pub struct Catalog {
    source: String,
    models: BTreeMap<String, ModelCard>,
}

static EMBEDDED: LazyLock<Catalog> = LazyLock::new(|| {
    serde_json::from_str(include_str!("catalog.json"))
        .expect("src/llm/catalog.json is valid (a unit test parses it)")
});

impl Catalog {
    /// The catalog built into this binary.
    pub fn embedded() -> &'static Catalog {
        &EMBEDDED
    }

    /// Where the snapshot came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The card of `model`: its exact id, else its id without the `<provider>/` prefix.
    pub fn card(&self, model: &str) -> Option<&ModelCard> {
        self.models.get(model).or_else(|| {
            let (_, bare) = model.split_once('/')?;
            self.models.get(bare)
        })
    }

    /// The ids `vendor`'s own API serves.
    pub fn models_of<'a>(&'a self, vendor: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.models
            .iter()
            .filter(move |(_, card)| card.vendor.as_deref() == Some(vendor))
            .map(|(id, _)| id.as_str())
    }
}

/// The catalog vendor a provider reaches: by its API's host, else by its name.
pub fn vendor_of(provider_name: &str, base_url: &str) -> Option<&'static str> {
    const HOSTS: [(&str, &str); 6] = [
        ("api.openai.com", "openai"),
        ("api.anthropic.com", "anthropic"),
        ("api.deepseek.com", "deepseek"),
        ("generativelanguage.googleapis.com", "gemini"),
        ("api.mistral.ai", "mistral"),
        ("api.x.ai", "xai"),
    ];
    let host = reqwest::Url::parse(base_url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_ascii_lowercase));
    HOSTS
        .iter()
        .find(|(known, vendor)| host.as_deref() == Some(*known) || provider_name == *vendor)
        .map(|(_, vendor)| *vendor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_catalog_parses_and_knows_the_models_teams_run() {
        let catalog = Catalog::embedded();
        assert!(
            catalog.source().starts_with("LiteLLM "),
            "{}",
            catalog.source()
        );
        let claude = catalog
            .card("claude-sonnet-4-5")
            .expect("claude-sonnet-4-5");
        assert_eq!(claude.vendor.as_deref(), Some("anthropic"));
        let price = claude.price().expect("priced");
        assert!(price.cache_write_per_mtok.unwrap() > price.input_per_mtok);
        assert!(price.cached_per_mtok() < price.input_per_mtok);
        assert_eq!(claude.images, Some(true));
        // Named through a provider, the bare id is found.
        let deepseek = catalog
            .card("ds/deepseek-v4-flash")
            .expect("deepseek-v4-flash");
        assert_eq!(deepseek.vendor.as_deref(), Some("deepseek"));
        assert!(deepseek.context_window.unwrap() >= 128_000);
        assert!(catalog.card("mock-model").is_none());
        assert!(catalog.models_of("openai").any(|id| id == "gpt-4o"));
        for (id, card) in &catalog.models {
            assert!(card.invalid().is_none(), "{id}");
            assert!(card.price().is_some(), "{id} has no price");
        }
    }

    #[test]
    fn a_configured_card_overrides_the_catalog_field_by_field() {
        let configured = ModelCard {
            images: Some(false),
            input_per_mtok: Some(1.0),
            ..ModelCard::default()
        };
        let catalog = ModelCard::priced(ModelPrice::new(3.0, 15.0));
        let merged = configured.over(&catalog);
        assert_eq!(merged.price(), Some(ModelPrice::new(1.0, 15.0)));
        assert_eq!(merged.images, Some(false));
    }

    #[test]
    fn providers_map_to_vendors_by_host_or_name() {
        assert_eq!(
            vendor_of("ds", "https://api.deepseek.com/v1"),
            Some("deepseek")
        );
        assert_eq!(
            vendor_of("anthropic", "http://127.0.0.1:9/v1"),
            Some("anthropic")
        );
        assert_eq!(vendor_of("local", "http://127.0.0.1:9/v1"), None);
    }
}
