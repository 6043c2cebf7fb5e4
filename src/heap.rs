//! Giving freed heap memory back to the system. glibc's allocator keeps what a burst of
//! sessions and connections freed in its per-thread arenas, so a server that served 10,000
//! sessions stays at that size after they are gone; a trim after such a burst returns it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long after the first release a trim runs: releases in a burst (thousands of sessions
/// closing at once) share one trim.
const TRIM_DELAY: Duration = Duration::from_millis(500);

/// Whether a trim is already scheduled.
static SCHEDULED: AtomicBool = AtomicBool::new(false);

/// Schedules a trim of the heap shortly, unless one is scheduled already. Call it when a
/// large owner of memory (a session actor, a connection) has gone. Needs a Tokio runtime; the
/// trim runs on a blocking thread, since it walks every arena.
pub fn trim_soon() {
    if SCHEDULED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        SCHEDULED.store(false, Ordering::Release);
        return;
    };
    runtime.spawn(async {
        tokio::time::sleep(TRIM_DELAY).await;
        SCHEDULED.store(false, Ordering::Release);
        let _ = tokio::task::spawn_blocking(trim_now).await;
    });
}

/// Returns the free pages of every arena to the system.
fn trim_now() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only reorganises the allocator's own free lists; it takes no
    // pointers and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
