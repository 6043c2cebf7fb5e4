//! The one integration test binary; each module under `suite/` covers one area through the
//! public API, with a real server from `support/` where sockets are involved.

mod suite;
mod support;
