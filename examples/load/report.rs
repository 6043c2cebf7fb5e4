//! Latency percentiles and the Markdown tables the scenarios print, ready to paste into
//! docs/PERFORMANCE.md.

use std::time::Duration;

use crate::child::{ServerProcess, Usage};

/// Latencies of one run, sorted.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    nanos: Vec<u64>,
}

impl Latencies {
    /// Sorts the samples.
    pub fn new(mut nanos: Vec<u64>) -> Self {
        nanos.sort_unstable();
        Self { nanos }
    }

    /// Merges the samples of several connections.
    pub fn merged(parts: Vec<Vec<u64>>) -> Self {
        Self::new(parts.into_iter().flatten().collect())
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// The `q` quantile (0 < q ≤ 1), nearest rank.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.nanos.is_empty() {
            return Duration::ZERO;
        }
        let rank = (q * self.nanos.len() as f64).ceil() as usize;
        let index = rank.clamp(1, self.nanos.len()) - 1;
        Duration::from_nanos(self.nanos[index])
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }
}

/// A duration since the start of a measurement, in whole nanoseconds for [`Latencies`].
pub fn nanos(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// What one server did during one measured run.
#[derive(Debug, Clone)]
pub struct Measured {
    /// One sample per request.
    pub latencies: Latencies,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// The server's CPU time and memory before the run.
    pub before: Usage,
    /// The same after the run.
    pub after: Usage,
}

impl Measured {
    /// Times `requests` calls of `step`, one after another, with `server`'s CPU time and
    /// memory read around them.
    pub async fn sequential(
        server: &ServerProcess,
        requests: u64,
        mut step: impl AsyncFnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let mut samples = Vec::with_capacity(requests as usize);
        let before = server.usage()?;
        let started = std::time::Instant::now();
        for _ in 0..requests {
            let sent = std::time::Instant::now();
            step().await?;
            samples.push(nanos(sent.elapsed()));
        }
        let elapsed = started.elapsed();
        let after = server.usage()?;
        Ok(Self {
            latencies: Latencies::new(samples),
            elapsed,
            before,
            after,
        })
    }

    /// Requests per second over the run.
    pub fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Server CPU time per request.
    pub fn cpu_per_request(&self) -> Duration {
        let cpu = self.after.cpu.saturating_sub(self.before.cpu);
        cpu.div_f64(self.latencies.len().max(1) as f64)
    }
}

/// A Markdown table whose columns are padded to line up in a terminal too.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|name| name.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are left empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Prints the table; every column but the first is right-aligned, since they hold figures.
    pub fn print(&self) {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate().take(columns) {
                widths[column] = widths[column].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut text = String::from("|");
            for (column, width) in widths.iter().enumerate() {
                let cell = cells.get(column).map_or("", String::as_str);
                let pad = width.saturating_sub(cell.chars().count());
                if column == 0 {
                    text.push_str(&format!(" {cell}{} |", " ".repeat(pad)));
                } else {
                    text.push_str(&format!(" {}{cell} |", " ".repeat(pad)));
                }
            }
            text
        };
        println!("{}", line(&self.header));
        let mut rule = String::from("|");
        for (column, width) in widths.iter().enumerate() {
            let dashes = "-".repeat((*width).max(3));
            if column == 0 {
                rule.push_str(&format!(" {dashes} |"));
            } else {
                rule.push_str(&format!(" {}: |", &dashes[1..]));
            }
        }
        println!("{rule}");
        for row in &self.rows {
            println!("{}", line(row));
        }
    }
}

/// Microseconds with one decimal.
pub fn us(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e6)
}

/// Mebibytes with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1_048_576.0)
}

/// `agentd / floor` as a factor.
pub fn ratio(agentd: f64, floor: f64) -> String {
    if floor <= 0.0 {
        return "–".into();
    }
    format!("{:.2}×", agentd / floor)
}

/// A whole count with thousands separators, as the docs write them.
pub fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut text = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            text.push(',');
        }
        text.push(digit);
    }
    text
}

/// The columns of a latency table.
pub const LATENCY_HEADER: [&str; 9] = [
    "server",
    "requests",
    "p50 µs",
    "p90 µs",
    "p99 µs",
    "p99.9 µs",
    "req/s",
    "CPU µs/req",
    "RSS MiB",
];

/// One latency row.
pub fn latency_row(label: &str, run: &Measured) -> Vec<String> {
    let l = &run.latencies;
    vec![
        label.to_string(),
        count(l.len() as u64),
        us(l.quantile(0.5)),
        us(l.quantile(0.9)),
        us(l.quantile(0.99)),
        us(l.quantile(0.999)),
        count(run.throughput().round() as u64),
        us(run.cpu_per_request()),
        mib(run.after.rss),
    ]
}

/// The row of agentd's figures divided by the floor's.
pub fn ratio_row(agentd: &Measured, floor: &Measured) -> Vec<String> {
    let q = |run: &Measured, q: f64| run.latencies.quantile(q).as_secs_f64();
    let mut row = vec!["agentd ÷ floor".to_string(), String::new()];
    for quantile in [0.5, 0.9, 0.99, 0.999] {
        row.push(ratio(q(agentd, quantile), q(floor, quantile)));
    }
    row.push(ratio(agentd.throughput(), floor.throughput()));
    row.push(ratio(
        agentd.cpu_per_request().as_secs_f64(),
        floor.cpu_per_request().as_secs_f64(),
    ));
    row.push(ratio(agentd.after.rss as f64, floor.after.rss as f64));
    row
}

/// A floor-then-agentd latency table with the ratio row.
pub fn print_latency_table(floor: &Measured, agentd: &Measured) {
    let mut table = Table::new(&LATENCY_HEADER);
    table.row(latency_row("floor", floor));
    table.row(latency_row("agentd", agentd));
    table.row(ratio_row(agentd, floor));
    table.print();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let latencies = Latencies::new((1..=1000).rev().collect());
        assert_eq!(latencies.p50(), Duration::from_nanos(500));
        assert_eq!(latencies.quantile(0.999), Duration::from_nanos(999));
        assert_eq!(latencies.quantile(1.0), Duration::from_nanos(1000));
        assert_eq!(Latencies::default().p50(), Duration::ZERO);
    }

    #[test]
    fn counts_have_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(10_000), "10,000");
        assert_eq!(count(1_234_567), "1,234,567");
    }
}
