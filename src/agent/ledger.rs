//! A session's one ledger: its spending cap, the budget held by work in flight, and the cost
//! rows of every model call made on its behalf — a turn's own calls, a pipeline's nodes, a
//! sub-agent's calls (a child bills its parent's ledger).
//!
//! Work that may spend holds budget first, under the ledger lock, so agents running at once
//! cannot each spend what is left; it writes its rows and releases its hold under the same lock,
//! so no reservation ever sees a spend that is in neither the rows nor the holds.

use std::collections::HashMap;
use std::sync::Arc;

use crate::llm::Usage;
use crate::llm::pricing::{CallCost, Pricing};
use crate::metrics::Metrics;
use crate::store::{CostRow, Store, Writer, timestamp_now};

/// How a cost row is labelled in the session's ledger.
#[derive(Debug, Clone)]
pub(crate) struct CostLabels {
    /// `agent` for the session's own turns, `agent:<agent_id>` for a sub-agent's.
    pub node_id: String,
    /// The session turn the rows belong to, if any.
    pub turn_id: Option<String>,
    /// The task the rows belong to (a background task, or a sub-agent).
    pub task_id: Option<String>,
}

/// A model call the ledger refused: it could pass the cap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverBudget {
    /// What counts as spent (rows and holds).
    pub spent: f64,
    /// The cap.
    pub cap: f64,
    /// What the call could cost.
    pub reserved: f64,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            spent,
            cap,
            reserved,
        } = self;
        write!(
            f,
            "the session has spent {spent:.4} USD of its {cap:.4} USD budget; the next model \
             call could cost up to {reserved:.4} USD"
        )
    }
}

/// A finished model call's cost row, priced by [`Ledger::price`] and not yet stored, with the
/// key its budget is held under until [`Ledger::written`].
#[derive(Debug)]
pub(crate) struct PricedRow {
    key: String,
    /// The row, for the host to store with the step's history.
    pub row: CostRow,
}

/// One session's cap, holds and cost rows; clones share them.
#[derive(Clone)]
pub(crate) struct Ledger {
    store: Arc<dyn Store>,
    writer: Arc<dyn Writer>,
    session_id: Arc<str>,
    metrics: Arc<Metrics>,
    pricing: Pricing,
    cap_usd: Option<f64>,
    /// Budget set aside by key (unique in the session) for work between its start and its
    /// rows: spent as far as the cap is concerned.
    held: Arc<std::sync::Mutex<HashMap<String, f64>>>,
    /// Serialises reading the spend with holding, and writing rows with releasing.
    lock: Arc<tokio::sync::Mutex<()>>,
    /// What the ledger knows of its rows without reading them back.
    rows: Arc<std::sync::Mutex<RowsSeen>>,
}

/// What a ledger knows of its session's rows, so a turn's model calls do not read them back.
#[derive(Default)]
struct RowsSeen {
    /// Rows the store refused (it was down or full), written again before the next row and
    /// counted against the cap meanwhile: a failing store must neither lose a bill nor lift
    /// the cap.
    unsaved: Vec<CostRow>,
    /// What the stored rows add up to: read once, then kept up to date by every row this
    /// ledger stores (the session's actor is the one writer of its rows while it lives).
    stored_usd: Option<f64>,
    /// Rows being written now, and how many writes have ended: a sum read while a row was on
    /// its way may or may not hold it, so it is used once and not kept.
    writing: u32,
    writes_ended: u64,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("session_id", &self.session_id)
            .field("cap_usd", &self.cap_usd)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// The ledger of `session_id`, reading rows from `store` and writing them through
    /// `writer`, capped at `cap_usd` when given.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        writer: Arc<dyn Writer>,
        session_id: Arc<str>,
        metrics: Arc<Metrics>,
        pricing: Pricing,
        cap_usd: Option<f64>,
    ) -> Self {
        Self {
            store,
            writer,
            session_id,
            metrics,
            pricing,
            cap_usd,
            held: Arc::default(),
            lock: Arc::default(),
            rows: Arc::default(),
        }
    }

    /// Tells the ledger its session has no stored rows yet (it was just created), so the first
    /// model call does not read them back.
    pub(crate) fn knows_no_rows(&self) {
        let mut seen = self.rows();
        if seen.writing == 0 && seen.stored_usd.is_none() {
            seen.stored_usd = Some(0.0);
        }
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, RowsSeen> {
        crate::mutex::lock(&self.rows)
    }

    /// What the rows not yet stored add up to, as the store would count them.
    fn unsaved_usd(&self, since: Option<time::OffsetDateTime>) -> f64 {
        self.rows()
            .unsaved
            .iter()
            .filter(|row| since.is_none_or(|since| row.committed && row.created_at >= since))
            .map(|row| row.actual_usd)
            .sum()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, f64>> {
        crate::mutex::lock(&self.held)
    }

    /// The prices the ledger bills at.
    pub(crate) fn pricing(&self) -> &Pricing {
        &self.pricing
    }

    /// What the session's committed rows add up to (0 when they cannot be read).
    pub(crate) async fn session_cost(&self) -> f64 {
        self.committed().await.unwrap_or(0.0)
    }

    /// What the session's committed rows of the last `window` add up to (0 when they cannot
    /// be read).
    pub(crate) async fn spent_within(&self, window: std::time::Duration) -> f64 {
        let since = time::OffsetDateTime::now_utc() - window;
        match self.store.cost_rows(&self.session_id).await {
            Ok(rows) => {
                rows.iter()
                    .filter(|row| row.committed && row.created_at >= since)
                    .map(|row| row.actual_usd)
                    .sum::<f64>()
                    + self.unsaved_usd(Some(since))
            }
            Err(err) => {
                tracing::error!(%err, "cost rows unreadable");
                0.0
            }
        }
    }

    async fn committed(&self) -> Option<f64> {
        let before = {
            let seen = self.rows();
            if let Some(stored) = seen.stored_usd {
                drop(seen);
                return Some(stored + self.unsaved_usd(None));
            }
            // A read that starts while a row is on its way is not kept (see `writing`).
            if seen.writing == 0 {
                seen.writes_ended
            } else {
                u64::MAX
            }
        };
        match self.store.cost_rows(&self.session_id).await {
            Ok(rows) => {
                // A float sum of nothing is -0.0; clients should read 0.
                let stored = rows.iter().fold(0.0, |sum, row| sum + row.actual_usd);
                let mut seen = self.rows();
                if seen.writing == 0 && seen.writes_ended == before {
                    seen.stored_usd = Some(stored);
                }
                drop(seen);
                Some(stored + self.unsaved_usd(None))
            }
            Err(err) => {
                tracing::error!(%err, "cost rows unreadable");
                None
            }
        }
    }

    /// What counts against the cap: committed rows plus holds; `None` when the rows cannot
    /// be read, which must refuse rather than allow.
    async fn spent(&self) -> Option<f64> {
        let committed = self.committed().await?;
        Some(committed + self.held().values().sum::<f64>())
    }

    /// Holds everything still left for the work `key` (a tool that calls models decides how
    /// to spend it) and answers how much that is; `None` when the session has no cap.
    pub(crate) async fn hold_rest(&self, key: &str) -> Option<f64> {
        let cap = self.cap_usd?;
        let _ledger = self.lock.lock().await;
        // An unreadable ledger leaves nothing to spend.
        let left = self
            .spent()
            .await
            .map_or(0.0, |spent| (cap - spent).max(0.0));
        self.held().insert(key.to_string(), left);
        Some(left)
    }

    /// Reserves a model call's worst case `reserved` for `key`; refuses (and records the
    /// refused call as an uncommitted row) when the session could pass its cap.
    pub(crate) async fn reserve(
        &self,
        key: &str,
        model: &str,
        reserved: f64,
        labels: &CostLabels,
    ) -> Result<(), OverBudget> {
        let Some(cap) = self.cap_usd else {
            return Ok(());
        };
        let _ledger = self.lock.lock().await;
        let spent = self.spent().await.unwrap_or(f64::INFINITY);
        if spent + reserved <= cap {
            self.held().insert(key.to_string(), reserved);
            return Ok(());
        }
        let row = self.row(labels, model, reserved, 0.0, Usage::default(), false);
        self.insert(&row).await;
        Err(OverBudget {
            spent,
            cap,
            reserved,
        })
    }

    /// Prices a finished model call of `model`, records its row and releases `key`; answers
    /// what it cost.
    pub(crate) async fn bill(
        &self,
        key: &str,
        model: &str,
        reserved: f64,
        usage: Usage,
        labels: &CostLabels,
    ) -> f64 {
        let priced = self.price(key, model, reserved, usage, labels);
        let actual = priced.row.actual_usd;
        self.written(priced, false).await;
        actual
    }

    /// Prices a finished model call of `model` like [`Ledger::bill`], but leaves its row to
    /// whoever writes the step's history, so both go in one commit; [`Ledger::written`] must
    /// be told how that went. `key` stays held until then, so the cap never sees a gap.
    pub(crate) fn price(
        &self,
        key: &str,
        model: &str,
        reserved: f64,
        usage: Usage,
        labels: &CostLabels,
    ) -> PricedRow {
        let row = self.priced_row(model, reserved, usage, labels);
        // On its way: a sum read meanwhile may or may not hold it (see `RowsSeen::writing`).
        self.rows().writing += 1;
        PricedRow {
            key: key.to_string(),
            row,
        }
    }

    /// A row [`Ledger::price`] made was stored with its step (`stored`), or was not, and the
    /// ledger writes it itself (keeping it to write again if the store refuses it); `key` is
    /// released.
    pub(crate) async fn written(&self, priced: PricedRow, stored: bool) {
        let _ledger = self.lock.lock().await;
        {
            let mut seen = self.rows();
            seen.writing = seen.writing.saturating_sub(1);
            seen.writes_ended += 1;
            if stored && let Some(sum) = &mut seen.stored_usd {
                *sum += priced.row.actual_usd;
            }
        }
        if !stored {
            self.insert(&priced.row).await;
        } else if !self.rows().unsaved.is_empty() {
            // Rows the store refused before are written again at the next row, whoever
            // stored it.
            self.write_rows(None).await;
        }
        self.release(&priced.key);
    }

    /// The committed row of a finished model call, priced and counted in the metrics.
    fn priced_row(&self, model: &str, reserved: f64, usage: Usage, labels: &CostLabels) -> CostRow {
        let actual = match self.pricing.cost_usd(model, &usage) {
            Some(cost) => cost,
            None => {
                self.metrics.unpriced_calls.inc();
                0.0
            }
        };
        self.metrics.record_llm_usage(usage.counts(), actual);
        self.row(labels, model, reserved, actual, usage, true)
    }

    /// Records the rows a tool reported for its own model calls and releases `key`, which
    /// was held until they are in, so the cap never sees a gap.
    pub(crate) async fn settle(&self, key: &str, costs: &[CallCost], labels: &CostLabels) {
        let _ledger = self.lock.lock().await;
        for cost in costs {
            if cost.unpriced {
                self.metrics.unpriced_calls.inc();
            }
            let usage = Usage {
                prompt_tokens: cost.tokens_in,
                completion_tokens: cost.tokens_out,
                cached_tokens: cost.tokens_cached,
                ..Usage::default()
            };
            self.metrics
                .record_llm_usage(usage.counts(), cost.actual_usd);
            let row = CostRow {
                node_id: cost.node_id.clone(),
                ..self.row(
                    labels,
                    &cost.model,
                    cost.reserved_usd,
                    cost.actual_usd,
                    usage,
                    cost.committed,
                )
            };
            self.insert(&row).await;
        }
        self.release(key);
    }

    /// Gives back what `key` held without recording anything (a call that failed before its
    /// price was known, work that never started).
    pub(crate) fn release(&self, key: &str) {
        self.held().remove(key);
    }

    fn row(
        &self,
        labels: &CostLabels,
        model: &str,
        reserved: f64,
        actual: f64,
        usage: Usage,
        committed: bool,
    ) -> CostRow {
        CostRow {
            session_id: self.session_id.to_string(),
            node_id: labels.node_id.clone(),
            model: model.to_string(),
            reserved_usd: reserved,
            actual_usd: actual,
            tokens_in: usage.prompt_tokens as i64,
            tokens_out: usage.completion_tokens as i64,
            tokens_cached: usage.cached_tokens as i64,
            committed,
            turn_id: labels.turn_id.clone(),
            task_id: labels.task_id.clone(),
            created_at: timestamp_now(),
        }
    }

    /// Stores `row`, after any the store refused before; a refused row is kept to try again.
    async fn insert(&self, row: &CostRow) {
        self.write_rows(Some(row)).await;
    }

    /// Stores the rows the store refused before, then `row` if given; a refused row is kept
    /// to try again.
    async fn write_rows(&self, row: Option<&CostRow>) {
        let earlier = std::mem::take(&mut self.rows().unsaved);
        for row in earlier.iter().chain(row) {
            self.rows().writing += 1;
            let written = self.writer.insert_cost_row(row).await;
            let mut seen = self.rows();
            seen.writing -= 1;
            seen.writes_ended += 1;
            match written {
                Ok(()) => {
                    if let Some(stored) = &mut seen.stored_usd {
                        *stored += row.actual_usd;
                    }
                }
                Err(err) => {
                    tracing::error!(%err, "cost row not stored yet; it is kept and written again with the next");
                    // The store may hold it after all: the sum is read again.
                    seen.stored_usd = None;
                    seen.unsaved.push(row.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::pricing::CallCost;
    use crate::store::{NewSession, connect};

    fn ledger_of(store: &Arc<dyn Store>) -> Ledger {
        let writer: Arc<dyn Writer> = Arc::clone(store) as Arc<dyn Writer>;
        Ledger::new(
            Arc::clone(store),
            writer,
            "s1".into(),
            Arc::new(Metrics::new()),
            Pricing::default(),
            Some(10.0),
        )
    }

    /// A throwaway store holding session `s1`.
    async fn store_with_s1() -> Arc<dyn Store> {
        let store = connect("sqlite::memory:").await.unwrap();
        store
            .create_session(&NewSession {
                session_id: "s1".into(),
                user_name: None,
                cwd: String::new(),
                title: None,
                parent_session_id: None,
                agent: None,
            })
            .await
            .unwrap();
        store
    }

    fn cost(actual_usd: f64) -> CallCost {
        CallCost {
            node_id: "n".into(),
            model: "m".into(),
            reserved_usd: actual_usd,
            actual_usd,
            tokens_in: 1,
            tokens_out: 1,
            tokens_cached: 0,
            committed: true,
            created_at: String::new(),
            unpriced: false,
        }
    }

    /// The spend is read from the store once and then kept by the rows the ledger writes, so
    /// a turn's model calls do not read the rows back: a row written behind the ledger's back
    /// (which cannot happen while the session's actor lives) is not seen until a new ledger
    /// reads them.
    #[tokio::test]
    async fn the_spend_is_read_once_then_kept_by_the_rows_the_ledger_writes() {
        let store = store_with_s1().await;
        let labels = CostLabels {
            node_id: "agent".into(),
            turn_id: None,
            task_id: None,
        };
        let ledger = ledger_of(&store);
        ledger.settle("a", &[cost(0.5)], &labels).await;
        assert_eq!(ledger.session_cost().await, 0.5);

        let behind = CostRow {
            actual_usd: 0.25,
            ..ledger.row(&labels, "m", 0.25, 0.25, Usage::default(), true)
        };
        store.insert_cost_row(&behind).await.unwrap();
        assert_eq!(ledger.session_cost().await, 0.5, "read back from the store");

        ledger.settle("b", &[cost(1.0), cost(2.0)], &labels).await;
        assert_eq!(ledger.session_cost().await, 3.5);
        // What counts against the cap is the kept sum too: 6.5 more would pass 10.
        assert_eq!(ledger.hold_rest("rest").await, Some(6.5));

        assert_eq!(ledger_of(&store).session_cost().await, 3.75);
    }

    /// A turn's model call is priced before its step is written, and its row goes in with the
    /// step's history; the hold counts against the cap until the ledger hears how that went,
    /// and the row is counted once either way.
    #[tokio::test]
    async fn a_row_priced_for_its_step_is_held_then_counted_once_stored_or_not() {
        let store = store_with_s1().await;
        let labels = CostLabels {
            node_id: "agent".into(),
            turn_id: Some("t1".into()),
            task_id: None,
        };
        let ledger = ledger_of(&store);
        ledger.settle("a", &[cost(0.5)], &labels).await;
        assert_eq!(ledger.session_cost().await, 0.5);

        ledger.reserve("step", "m", 2.0, &labels).await.unwrap();
        let mut priced = ledger.price("step", "m", 2.0, Usage::default(), &labels);
        priced.row.actual_usd = 1.5;
        // On its way with the step: the hold still counts against the cap.
        assert_eq!(ledger.hold_rest("probe").await, Some(7.5));
        ledger.release("probe");
        // The host stores the row with the step, then tells the ledger.
        store.insert_cost_row(&priced.row).await.unwrap();
        ledger.written(priced, true).await;
        assert_eq!(ledger.session_cost().await, 2.0);
        assert_eq!(store.cost_rows("s1").await.unwrap().len(), 2);

        // A step that could not store it: the ledger writes it itself.
        ledger.reserve("step2", "m", 1.0, &labels).await.unwrap();
        let mut priced = ledger.price("step2", "m", 1.0, Usage::default(), &labels);
        priced.row.actual_usd = 0.25;
        ledger.written(priced, false).await;
        assert_eq!(ledger.session_cost().await, 2.25);
        assert_eq!(store.cost_rows("s1").await.unwrap().len(), 3);
        // Both holds are gone, and a fresh read of the store agrees with the kept sum.
        assert_eq!(ledger.hold_rest("rest").await, Some(7.75));
        assert_eq!(ledger_of(&store).session_cost().await, 2.25);
    }
}
