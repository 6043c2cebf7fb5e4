//! Background task output: where a long-running tool's output is stored and how clients read it.
//!
//! Each task's output is one append-only file `<data_dir>/tasks/<task_id>.log`.
//!
//! - [`spool`]: the write side — [`spool::OutputSpool`] appends output as it is produced, with
//!   bounded memory, so a crash loses at most the write in flight.
//! - [`query`]: what `read_task_output` asks for — [`query::OutputParams`], the one form of its
//!   parameters behind every door, validated into a [`query::OutputQuery`] (head, tail, grep,
//!   line_range, bytes).
//! - [`output`]: the read side — [`output::read_output`] answers a query at a cost that follows
//!   the size of the answer rather than the size of the file.
//! - [`supervisor`]: a session's running tasks — started for spawn_only calls, output spooled
//!   and reported in coalesced pieces, the end reported once.
//! - [`read`]: `read_task_output` behind REST, the WebSocket and the model tool.
//! - [`tools`]: the model's `read_task_output` and `check_background_tasks`.

pub mod output;
pub mod query;
pub mod read;
pub mod spool;
pub mod supervisor;
pub mod tools;
