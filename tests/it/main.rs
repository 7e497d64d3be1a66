//! Integration tests of the `tally` crate, one module per area.

mod common;
mod emission;
mod errors;
mod oracle;
mod types;
