//! The one integration test binary; each module under `suite/` covers one area through the
//! public API, with a real server from `support/` where sockets are involved.

// Reads what the test or benchmark made itself; the bounded readers are for the server.
#![allow(clippy::disallowed_methods)]

mod suite;
mod support;
