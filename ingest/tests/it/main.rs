//! Ingest's integration tests, one binary (one link step); each module says what it covers.

mod common;
mod corrupt;
mod fastpath;
mod foreign;
mod golden;
mod mixed;
mod props;
