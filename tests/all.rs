//! The one integration test binary; each module under `suite/` covers one area through the
//! public API.

mod suite;
