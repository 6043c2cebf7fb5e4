//! Background task output: where a long-running tool's output is stored and how clients read it.
//!
//! Each task's output is one append-only file `<data_dir>/tasks/<task_id>.log`.
//!
//! - [`spool`]: the write side — [`spool::OutputSpool`] appends output as it is produced, with
//!   bounded memory, so a crash loses at most the write in flight.
//! - [`output`]: the read side behind `read_task_output` — [`output::OutputQuery`] (head, tail,
//!   grep, line_range, bytes) and [`output::read_output`], whose cost follows the size of the
//!   answer rather than the size of the file.
//! - [`supervisor`]: a session's running tasks — started for spawn_only calls, output spooled
//!   and reported in coalesced pieces, the end reported once.
//! - [`read`]: `read_task_output` behind REST, the WebSocket and the model tool.
//! - [`tools`]: the model's `read_task_output` and `check_background_tasks`.

pub mod output;
pub mod read;
pub mod spool;
pub mod supervisor;
pub mod tools;
