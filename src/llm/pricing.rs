//! USD per token by model, from `[llm.pricing."MODEL"]` over the embedded catalog: what a call cost, what to reserve
//! before making one, and a conservative estimate of a prompt's size.
//!
//! Models without a price are "unpriced": [`Pricing::cost_usd`] and [`Pricing::reserve_usd`]
//! answer `None`, which callers count as 0 USD and report as an unpriced call.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::catalog::{Catalog, ModelCard};
use super::{ChatMessage, ImageData, ToolSpec, Usage};

/// Bytes of serialised JSON counted as one token. Real tokenisers average about 4 bytes per
/// token on English prose and about 3 on code and JSON; 3 over-estimates both, which is the
/// safe side for budget reservations and context checks.
pub const BYTES_PER_TOKEN: u64 = 3;
/// Tokens added per message for the role and the separators chat templates wrap it in.
pub const TOKENS_PER_MESSAGE: u64 = 4;
/// Tokens added per tool for the wrapping the server puts around its schema.
pub const TOKENS_PER_TOOL: u64 = 8;
/// Tokens added once for the priming of the model's reply.
pub const TOKENS_PER_REQUEST: u64 = 3;

/// USD per million tokens for one model.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Prompt tokens.
    pub input_per_mtok: f64,
    /// Completion tokens.
    pub output_per_mtok: f64,
    /// Prompt tokens served from the provider's prompt cache; the input price when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<f64>,
    /// Prompt tokens written to the provider's prompt cache (Anthropic); the input price when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<f64>,
}

impl ModelPrice {
    /// A price with cached prompt tokens at the input price.
    pub fn new(input_per_mtok: f64, output_per_mtok: f64) -> Self {
        Self {
            input_per_mtok,
            output_per_mtok,
            cached_input_per_mtok: None,
            cache_write_per_mtok: None,
        }
    }

    /// The price of a cached prompt token, per million.
    pub fn cached_per_mtok(&self) -> f64 {
        self.cached_input_per_mtok.unwrap_or(self.input_per_mtok)
    }
}

/// The cost of one model call a tool made on the session's behalf (a pipeline node): one row
/// of the session's ledger, as the tool reports it and as `node_costs` carries it on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallCost {
    /// What made the call (`run_pipeline`'s node id).
    pub node_id: String,
    /// The model called.
    pub model: String,
    /// What was set aside for the call before it ran.
    pub reserved_usd: f64,
    /// What it cost (0 for an unpriced model).
    pub actual_usd: f64,
    /// Prompt tokens.
    pub tokens_in: u64,
    /// Completion tokens.
    pub tokens_out: u64,
    /// Of the prompt tokens, those served from the provider's prompt cache.
    #[serde(default)]
    pub tokens_cached: u64,
    /// Whether the call settled (false: refused before it ran).
    pub committed: bool,
    /// When the tool recorded it, RFC 3339.
    pub created_at: String,
    /// The model has no price, so `actual_usd` says nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unpriced: bool,
}

/// What a tool that calls models may still spend of the budget held for it: each call
/// reserves its worst case first and gives back the difference once it is priced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowance {
    /// `None`: the session has no cap.
    left: Option<f64>,
}

impl Allowance {
    /// An allowance of `left` USD, or unlimited.
    pub fn new(left: Option<f64>) -> Self {
        Self { left }
    }

    /// Sets aside `usd`; refuses with what is left when it does not fit.
    pub fn reserve(&mut self, usd: f64) -> Result<(), f64> {
        match self.left.as_mut() {
            Some(left) if usd > *left => Err(left.max(0.0)),
            Some(left) => {
                *left -= usd;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A call that reserved `reserved` cost `actual`: the rest comes back.
    pub fn settle(&mut self, reserved: f64, actual: f64) {
        if let Some(left) = self.left.as_mut() {
            *left += reserved - actual;
        }
    }
}

/// Prices and limits of models: `[llm.pricing]` over the embedded catalog.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pricing {
    cards: BTreeMap<String, ModelCard>,
    /// The catalog under the configured cards; `None` prices only what is configured.
    catalog: Option<&'static Catalog>,
}

impl Pricing {
    /// Prices from a table of model id → price, without the catalog.
    pub fn new(prices: BTreeMap<String, ModelPrice>) -> Self {
        Self {
            cards: prices
                .into_iter()
                .map(|(id, price)| (id, ModelCard::priced(price)))
                .collect(),
            catalog: None,
        }
    }

    /// The configured cards over the embedded catalog: what a server runs with.
    pub fn with_catalog(cards: BTreeMap<String, ModelCard>) -> Self {
        Self {
            cards,
            catalog: Some(Catalog::embedded()),
        }
    }

    /// Everything known of `model`: the configured card (its exact id, else its id without
    /// the `<provider>/` prefix, so a price set for `gpt-4o` holds at every provider serving
    /// it) over the catalog's.
    pub fn card(&self, model: &str) -> ModelCard {
        let configured = self.cards.get(model).or_else(|| {
            let (_, bare) = model.split_once('/')?;
            self.cards.get(bare)
        });
        let listed = self.catalog.and_then(|catalog| catalog.card(model));
        match (configured, listed) {
            (Some(configured), Some(listed)) => configured.over(listed),
            (Some(card), None) | (None, Some(card)) => card.clone(),
            (None, None) => ModelCard::default(),
        }
    }

    /// The price of `model`, when both its input and output prices are known.
    pub fn price(&self, model: &str) -> Option<ModelPrice> {
        self.card(model).price()
    }

    /// Whether `model` has a price; calls to other models are counted as unpriced.
    pub fn is_priced(&self, model: &str) -> bool {
        self.price(model).is_some()
    }

    /// The ids configured in `[llm.pricing]`.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.cards.keys().map(String::as_str)
    }

    /// The context window to plan `model`'s prompts by: what its card says, at most `limit`
    /// (`[llm] context_window`), which is also the answer when the card says nothing.
    pub fn context_window(&self, model: &str, limit: u32) -> u32 {
        self.card(model)
            .context_window
            .map_or(limit, |window| window.min(limit))
    }

    /// Whether a request to `model` may carry images: unless its card says it takes none
    /// (a model nothing is known of is given the benefit of the doubt; its API answers).
    pub fn takes_images(&self, model: &str) -> bool {
        self.card(model).images.unwrap_or(true)
    }

    /// The catalog under the configured cards, if any.
    pub fn catalog(&self) -> Option<&'static Catalog> {
        self.catalog
    }

    /// What a finished call cost; `None` for an unpriced model.
    pub fn cost_usd(&self, model: &str, usage: &Usage) -> Option<f64> {
        let price = self.price(model)?;
        let price = &price;
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let written = usage.cache_write_tokens.min(usage.prompt_tokens - cached);
        let write_price = price.cache_write_per_mtok.unwrap_or(price.input_per_mtok);
        Some(
            usd(
                price,
                usage.prompt_tokens - cached - written,
                usage.completion_tokens,
            ) + cached as f64 * price.cached_per_mtok() / 1_000_000.0
                + written as f64 * write_price / 1_000_000.0,
        )
    }

    /// What to reserve before a call: the estimated prompt plus the whole completion cap, at
    /// the model's prices, as if nothing were cached (the worst case); `None` for an unpriced
    /// model.
    pub fn reserve_usd(
        &self,
        model: &str,
        prompt_tokens_estimate: u64,
        max_tokens: u32,
    ) -> Option<f64> {
        let price = self.price(model)?;
        Some(usd(&price, prompt_tokens_estimate, u64::from(max_tokens)))
    }

    /// A conservative estimate of the prompt tokens a request will use: the serialised JSON of
    /// every message and tool spec at [`BYTES_PER_TOKEN`] bytes per token (rounded up), plus
    /// [`TOKENS_PER_MESSAGE`] per message, [`TOKENS_PER_TOOL`] per tool and
    /// [`TOKENS_PER_REQUEST`] once. UTF-8 bytes rather than characters, so non-Latin text
    /// (about one token per character, three bytes each) is not under-counted either.
    pub fn estimate_prompt_tokens(messages: &[ChatMessage], tools: &[ToolSpec]) -> u64 {
        let message_bytes: u64 = messages.iter().map(Self::message_bytes).sum();
        let tool_bytes: u64 = tools.iter().map(Self::json_bytes).sum();
        Self::tokens_from_parts(message_bytes, messages.len(), tool_bytes, tools.len())
    }

    /// The size one message counts as: its serialised JSON, except that each image counts as
    /// [`ImageData::ESTIMATED_TOKENS`] rather than its base64 bytes (the APIs charge by
    /// pixels, not by bytes).
    pub fn message_bytes(message: &ChatMessage) -> u64 {
        match message {
            ChatMessage::User { content, images } if !images.is_empty() => {
                Self::json_bytes(&ChatMessage::user(content.as_str()))
                    + images.len() as u64 * ImageData::ESTIMATED_TOKENS * BYTES_PER_TOKEN
            }
            _ => Self::json_bytes(message),
        }
    }

    /// The serialised size of one message or tool spec, as the estimate counts it. Counted as
    /// it is written, not written out: a model call measures every message and spec, some of
    /// them twice.
    pub fn json_bytes(value: &impl serde::Serialize) -> u64 {
        /// Counts what is written to it, and keeps none of it.
        struct Counted(u64);

        impl std::io::Write for Counted {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0 += bytes.len() as u64;
                Ok(bytes.len())
            }

            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        let mut counted = Counted(0);
        match serde_json::to_writer(&mut counted, value) {
            Ok(()) => counted.0,
            Err(_) => 0,
        }
    }

    /// [`Pricing::estimate_prompt_tokens`] from sizes already measured with
    /// [`Pricing::json_bytes`], for callers that weigh many subsets of one conversation.
    pub fn tokens_from_parts(
        message_bytes: u64,
        messages: usize,
        tool_bytes: u64,
        tools: usize,
    ) -> u64 {
        (message_bytes + tool_bytes).div_ceil(BYTES_PER_TOKEN)
            + TOKENS_PER_MESSAGE * messages as u64
            + TOKENS_PER_TOOL * tools as u64
            + TOKENS_PER_REQUEST
    }
}

/// Tokens at a price, in USD.
fn usd(price: &ModelPrice, prompt_tokens: u64, completion_tokens: u64) -> f64 {
    (prompt_tokens as f64 * price.input_per_mtok + completion_tokens as f64 * price.output_per_mtok)
        / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;
    use serde_json::json;

    #[test]
    fn json_bytes_counts_what_serde_json_writes() {
        let message = ChatMessage::user("naïve 日本語 \"quoted\" \n line");
        let spec = ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}})
                .into(),
        };
        for (counted, written) in [
            (
                Pricing::json_bytes(&message),
                serde_json::to_string(&message).unwrap(),
            ),
            (
                Pricing::json_bytes(&spec),
                serde_json::to_string(&spec).unwrap(),
            ),
        ] {
            assert_eq!(counted, written.len() as u64, "{written}");
        }
    }

    fn pricing() -> Pricing {
        let mut table = BTreeMap::new();
        table.insert("gpt-test".to_string(), ModelPrice::new(2.5, 10.0));
        table.insert("free".to_string(), ModelPrice::new(0.0, 0.0));
        Pricing::new(table)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn cost_follows_the_price_per_million_tokens() {
        let usage = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 500_000,
            cached_tokens: 0,
            cache_write_tokens: 0,
        };
        assert!(close(pricing().cost_usd("gpt-test", &usage).unwrap(), 7.5));
        let small = Usage {
            prompt_tokens: 1200,
            completion_tokens: 300,
            cached_tokens: 0,
            cache_write_tokens: 0,
        };
        assert!(close(
            pricing().cost_usd("gpt-test", &small).unwrap(),
            0.003 + 0.003
        ));
        assert_eq!(pricing().cost_usd("free", &small), Some(0.0));
    }

    #[test]
    fn cached_prompt_tokens_cost_the_cached_price_or_else_the_input_price() {
        let usage = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 0,
            cached_tokens: 800_000,
            cache_write_tokens: 0,
        };
        // Unset: a cached token costs what any prompt token costs.
        assert!(close(pricing().cost_usd("gpt-test", &usage).unwrap(), 2.5));
        let mut table = BTreeMap::new();
        table.insert(
            "cached".to_string(),
            ModelPrice {
                cached_input_per_mtok: Some(0.25),
                ..ModelPrice::new(2.5, 10.0)
            },
        );
        let pricing = Pricing::new(table);
        assert!(close(
            pricing.cost_usd("cached", &usage).unwrap(),
            0.2 * 2.5 + 0.8 * 0.25
        ));
        // A server claiming more cached than prompt tokens is held to the prompt.
        let odd = Usage {
            cached_tokens: 5_000_000,
            ..usage
        };
        assert!(close(pricing.cost_usd("cached", &odd).unwrap(), 0.25));
        // The reservation still assumes nothing is cached.
        assert!(close(
            pricing.reserve_usd("cached", 1_000_000, 0).unwrap(),
            2.5
        ));
    }

    #[test]
    fn unknown_models_are_unpriced_not_free() {
        let pricing = pricing();
        assert_eq!(pricing.cost_usd("other", &Usage::default()), None);
        assert_eq!(pricing.reserve_usd("other", 10, 10), None);
        assert!(!pricing.is_priced("other"));
        assert!(pricing.is_priced("free"));
        assert!(!pricing.is_priced("GPT-TEST"));
    }

    #[test]
    fn reservation_prices_the_estimate_and_the_whole_cap() {
        let reserved = pricing().reserve_usd("gpt-test", 4000, 4096).unwrap();
        assert!(close(reserved, (4000.0 * 2.5 + 4096.0 * 10.0) / 1e6));
    }

    #[test]
    fn new_takes_the_pricing_table() {
        let mut table = BTreeMap::new();
        table.insert("m".into(), ModelPrice::new(1.0, 2.0));
        let pricing = Pricing::new(table);
        assert_eq!(pricing.price("m").map(|p| p.output_per_mtok), Some(2.0));
    }

    #[test]
    fn estimate_is_documented_formula_and_conservative() {
        assert_eq!(
            Pricing::estimate_prompt_tokens(&[], &[]),
            TOKENS_PER_REQUEST
        );

        let message = ChatMessage::User {
            content: "a".repeat(300),
            images: Vec::new(),
        };
        let bytes = serde_json::to_string(&message).unwrap().len() as u64;
        assert_eq!(
            Pricing::estimate_prompt_tokens(std::slice::from_ref(&message), &[]),
            bytes.div_ceil(3) + TOKENS_PER_MESSAGE + TOKENS_PER_REQUEST
        );
        // At least one token per four characters of content: never below the usual heuristic.
        assert!(Pricing::estimate_prompt_tokens(&[message], &[]) >= 300 / 4);

        let tool = ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            input_schema: json!({"type":"object","properties":{"path":{"type":"string"}}}).into(),
        };
        let with_tool = Pricing::estimate_prompt_tokens(&[], std::slice::from_ref(&tool));
        let tool_bytes = serde_json::to_string(&tool).unwrap().len() as u64;
        assert_eq!(
            with_tool,
            tool_bytes.div_ceil(3) + TOKENS_PER_TOOL + TOKENS_PER_REQUEST
        );
    }

    #[test]
    fn estimate_grows_with_tool_calls_and_non_latin_text() {
        let plain = ChatMessage::Assistant {
            reasoning: None,
            content: None,
            tool_calls: vec![],
        };
        let with_call = ChatMessage::Assistant {
            reasoning: None,
            content: None,
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: "grep".into(),
                arguments: "{\"pattern\":\"needle\"}".into(),
            }],
        };
        assert!(
            Pricing::estimate_prompt_tokens(&[with_call], &[])
                > Pricing::estimate_prompt_tokens(&[plain], &[])
        );
        let cjk = ChatMessage::User {
            content: "漢".repeat(100),
            images: Vec::new(),
        };
        // About one token per CJK character; the estimate must not fall below that.
        assert!(Pricing::estimate_prompt_tokens(&[cjk], &[]) >= 100);
    }
}
