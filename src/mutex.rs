//! Taking a `std::sync::Mutex` whether or not a panic poisoned it.
//!
//! Every mutex in the server guards data that each holder changes in one whole step (an
//! insert, a push, an assignment), so a holder that panicked leaves nothing half-made, and
//! refusing the data after it would turn one panic into many.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking its data even if an earlier holder panicked.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
